"""The passkit-triton GPU check: correctness, step time against eager and Inductor, kernel times.

Needs CUDA, Triton, transformers and the passkit-triton plugin installed
(``pip install -e ".[dev]" -e plugins/passkit-triton``). Three parts, each printing a table:

1. Correctness. The d=64 two-layer block, the d=256 two-layer block and a Hugging Face GPT-2 at
   its defaults (dropout on) with GPT-2's vocabulary of 50,257 (its logits' rows are longer than
   ``max_row``, so the looped kernels run), each compiled with ``training-triton`` and run for one
   training step in float32 and in bfloat16, against eager, with the generator seeded alike
   before each step. Outputs and gradients are paired by name: a gradient missing on either
   side fails. float32 must match eager within 1e-3 (every output and gradient, relative to its
   largest magnitude). bfloat16 is judged against eager in float32: passkit's error may be at
   most twice eager-bfloat16's own error plus one bfloat16 ulp, the usual test for a
   low-precision compiler. The ``worst`` column names the tensor furthest off.
2. Step time, bfloat16, d=256 block (batch 8, sequence 128) and GPT-2: eager, ``torch.compile``
   (Inductor) and ``training-triton``, interleaved round by round in a rotating order; medians and
   the ratios to Inductor. Target: training-triton <= 1.2 x Inductor on the d=256 block.
3. Kernels, bfloat16: a softmax over (4096, 1024) rows with a scale and a mask, and a layer norm
   over (16384, 1024), each compiled by ``inference-triton`` and by Inductor, timed with
   ``triton.testing.do_bench``. Target: within 1.1 x Inductor.

Exit status: 0 all checks and targets met, 1 a correctness check failed, 3 a speed target was
missed, 2 no CUDA device. Run: ``python benchmarks/triton_gpu.py [--rounds 20] [--parts
correctness,steps,kernels] [--json OUT]``.
``TRITON_INTERPRET=1 python benchmarks/triton_gpu.py --smoke --rounds 1`` runs the same code on
the CPU with small sizes (the d=64 block, and a one-layer GPT-2 that keeps the 50,257-word
vocabulary), to check the script itself where no GPU is available.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

import torch

import passkit
from passkit.examples import transformer

DEVICE = "cuda"
STEP_TARGET = 1.2
KERNEL_TARGET = 1.1
BF16_ULP = 2.0**-8


VOCAB = 50257  # GPT-2's own: its logits' rows (and their softmax) are longer than max_row


class GPT2Step(torch.nn.Module):
    """A Hugging Face GPT-2 LM at its defaults (dropout on) whose output is (loss, logits)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.lm(input_ids=ids, labels=ids)
        return out.loss, out.logits


def gpt2() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    small = DEVICE != "cuda"  # the smoke run: the same model, sized for Triton's interpreter
    layers, heads, width, batch, sequence = (1, 2, 32, 1, 8) if small else (2, 4, 256, 8, 128)
    config = transformers.GPT2Config(n_layer=layers, n_head=heads, n_embd=width, vocab_size=VOCAB, n_positions=256)
    torch.manual_seed(0)
    lm = transformers.GPT2LMHeadModel(config).train()
    lm.config._attn_implementation = "eager"
    return GPT2Step(lm), (torch.randint(0, VOCAB, (batch, sequence)),)


WORKLOADS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]] = {
    "block-d64": transformer.small_stack,
    "block-d256": transformer.large_stack,
    "gpt2": gpt2,
}


def prepared(name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    model, inputs = WORKLOADS[name]()
    model = model.to(DEVICE).to(dtype)
    return model, tuple(t.to(DEVICE).to(dtype) if t.is_floating_point() else t.to(DEVICE) for t in inputs)


def loss_of(out: Any) -> torch.Tensor:
    if isinstance(out, tuple):  # GPT2Step: its loss is the model's own (cross-entropy over the vocabulary)
        return out[0].float()
    return (out.float() ** 2).mean()


def outputs_of(out: Any) -> list[torch.Tensor]:
    return [t.detach() for t in (out if isinstance(out, tuple) else (out,))]


Step = tuple[list[torch.Tensor], dict[str, torch.Tensor | None]]


def step(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Step:
    return step_compiled(model, model, inputs)


def step_compiled(compiled: Any, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Step:
    """One training step: the outputs, and every parameter's gradient by name (None if it has none).

    The generator is seeded first, so dropout draws from the same state in every run.
    """
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    out = compiled(*inputs)
    loss_of(out).backward()
    grads = {name: None if p.grad is None else p.grad.detach() for name, p in model.named_parameters()}
    return outputs_of(out), grads


def paired(ours: Step, theirs: Step) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, ours, theirs) for every output and gradient; a missing one raises, never drops out."""
    if len(ours[0]) != len(theirs[0]):
        raise AssertionError(f"{len(ours[0])} outputs, expected {len(theirs[0])}")
    pairs = [(f"output {i}", a, b) for i, (a, b) in enumerate(zip(ours[0], theirs[0]))]
    if ours[1].keys() != theirs[1].keys():
        raise AssertionError(f"parameters differ: {sorted(ours[1].keys() ^ theirs[1].keys())}")
    for name, reference in theirs[1].items():
        mine = ours[1][name]
        if (mine is None) != (reference is None):
            raise AssertionError(f"gradient of {name}: {'missing' if mine is None else 'unexpected'}")
        if mine is not None and reference is not None:
            pairs.append((f"grad {name}", mine, reference))
    return pairs


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    scale = reference.float().abs().max().clamp_min(1e-12)
    return float((actual.float() - reference.float()).abs().max() / scale)


def check_correctness() -> tuple[list[dict[str, Any]], bool]:
    rows, ok = [], True
    for name in WORKLOADS if DEVICE == "cuda" else ["block-d64", "gpt2"]:
        reference_model, inputs32 = prepared(name, torch.float32)
        reference = step(reference_model, inputs32)
        for dtype in (torch.float32, torch.bfloat16):
            eager_model, inputs = prepared(name, dtype)
            compiled_model = copy.deepcopy(eager_model)
            compiled = passkit.compile(compiled_model, pipeline="training-triton")
            ours = step_compiled(compiled, compiled_model, inputs)
            eager = step(eager_model, inputs)
            try:
                ours_errors = {label: relative_error(a, r) for label, a, r in paired(ours, reference)}
                eager_errors = {label: relative_error(e, r) for label, e, r in paired(eager, reference)}
                against_eager = {label: relative_error(a, e) for label, a, e in paired(ours, eager)}
            except AssertionError as failure:
                ok = False
                rows.append({"workload": name, "dtype": str(dtype).removeprefix("torch."), "passkit_error": float("nan"),
                             "eager_error": float("nan"), "worst": str(failure), "ok": False})
                continue
            if dtype == torch.float32:
                worst = max(against_eager, key=against_eager.__getitem__)
                passed = against_eager[worst] <= 1e-3
            else:
                worst = max(ours_errors, key=ours_errors.__getitem__)
                passed = ours_errors[worst] <= 2 * max(eager_errors.values()) + BF16_ULP
            ok &= passed
            rows.append({"workload": name, "dtype": str(dtype).removeprefix("torch."),
                         "passkit_error": max(ours_errors.values()), "eager_error": max(eager_errors.values()),
                         "worst": worst, "ok": passed})
    return rows, ok


def time_steps(rounds: int) -> tuple[list[dict[str, Any]], bool]:
    rows, ok = [], True
    for name in ("block-d256", "gpt2") if DEVICE == "cuda" else ["block-d64"]:
        contenders: dict[str, tuple[Callable[..., Any], torch.nn.Module, tuple[torch.Tensor, ...]]] = {}
        for label in ("eager", "inductor", "training-triton"):
            model, inputs = prepared(name, torch.bfloat16)
            runner: Callable[..., Any] = model
            if label == "inductor":
                runner = torch.compile(model, backend="inductor")
            elif label == "training-triton":
                runner = passkit.compile(model, pipeline="training-triton")
            contenders[label] = (runner, model, inputs)
            for _ in range(3):  # compile and autotune outside the timing
                step_compiled(runner, model, inputs)
        times: dict[str, list[float]] = {label: [] for label in contenders}
        labels = list(contenders)
        for round_index in range(rounds):
            order = labels[round_index % len(labels):] + labels[: round_index % len(labels)]
            for label in order:
                runner, model, inputs = contenders[label]
                times[label].append(elapsed_ms(lambda: step_compiled(runner, model, inputs)))
        medians = {label: statistics.median(samples) for label, samples in times.items()}
        ratio = medians["training-triton"] / medians["inductor"]
        if name == "block-d256":
            ok &= ratio <= STEP_TARGET
        rows.append({"workload": name, **{f"{k}_ms": v for k, v in medians.items()},
                     "triton/inductor": ratio, "triton/eager": medians["training-triton"] / medians["eager"]})
    return rows, ok


def elapsed_ms(fn: Callable[[], Any]) -> float:
    if DEVICE != "cuda":
        started = time.perf_counter()
        fn()
        return (time.perf_counter() - started) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def bench_ms(fn: Callable[[], Any]) -> float:
    if DEVICE != "cuda":
        return statistics.median(elapsed_ms(fn) for _ in range(3))
    from triton.testing import do_bench

    return statistics.median(do_bench(fn, return_mode="all"))


def scaled_masked_softmax(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.softmax((x * 0.125).masked_fill(mask, float("-inf")), dim=-1)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)


def time_kernels() -> tuple[list[dict[str, Any]], bool]:
    rows_count = 4096 if DEVICE == "cuda" else 16
    cases = {
        "softmax": (scaled_masked_softmax, (torch.randn(rows_count, 1024), torch.rand(rows_count, 1024) > 0.9)),
        "layer_norm": (layer_norm, (torch.randn(4 * rows_count, 1024), torch.randn(1024), torch.randn(1024))),
    }
    rows, ok = [], True
    for name, (fn, cpu_inputs) in cases.items():
        inputs = tuple(t.to(DEVICE).to(torch.bfloat16) if t.is_floating_point() else t.to(DEVICE) for t in cpu_inputs)
        ours = passkit.aot_function(fn, pipeline="inference-triton")
        theirs = torch.compile(fn, backend="inductor")
        expected = fn(*[t.float() if t.is_floating_point() else t for t in inputs])
        for candidate in (ours, theirs):
            torch.testing.assert_close(candidate(*inputs).float(), expected, rtol=2e-2, atol=2e-2)
        ours_ms = bench_ms(lambda: ours(*inputs))
        theirs_ms = bench_ms(lambda: theirs(*inputs))
        ratio = ours_ms / theirs_ms
        ok &= ratio <= KERNEL_TARGET
        rows.append({"kernel": name, "inference-triton_ms": ours_ms, "inductor_ms": theirs_ms, "ratio": ratio})
    return rows, ok


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    if not rows:
        return
    columns = list(rows[0])
    print("  ".join(f"{c:>16}" for c in columns))
    for row in rows:
        print("  ".join(f"{row[c]:>16.4g}" if isinstance(row[c], float) else f"{str(row[c]):>16}" for c in columns))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--parts", default="correctness,steps,kernels", help="comma-separated parts to run")
    parser.add_argument(
        "--smoke", action="store_true",
        help="dry run on the CPU in Triton's interpreter (small sizes, d=64 block only): checks the script, not the GPU",
    )
    args = parser.parse_args()
    global DEVICE
    if args.smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("triton_gpu.py: --smoke needs TRITON_INTERPRET=1 in the environment", file=sys.stderr)
            return 2
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        print("triton_gpu.py: no CUDA device; this check needs a GPU", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (interpreter smoke run: figures mean nothing)"
    print(f"device: {device_name}  torch {torch.__version__}")
    parts = set(args.parts.split(","))
    correctness, correct = check_correctness() if "correctness" in parts else ([], True)
    print_table("correctness (one training step; error relative to the largest magnitude, vs eager float32)", correctness)
    steps, steps_ok = time_steps(args.rounds) if "steps" in parts else ([], True)
    print_table(f"bfloat16 training step, median of {args.rounds} interleaved rounds (ms)", steps)
    kernels, kernels_ok = time_kernels() if "kernels" in parts else ([], True)
    print_table("bfloat16 kernels, median (ms)", kernels)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"correctness": correctness, "steps": steps, "kernels": kernels}, out, indent=2)
    if not correct:
        return 1
    return 0 if steps_ok and kernels_ok else 3


if __name__ == "__main__":
    sys.exit(main())
