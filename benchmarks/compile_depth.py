"""Cold compile time against model depth: eager, Inductor, and ``training`` with and without regions.

Workloads: the acceptance block stack (``passkit.examples.transformer``, d=64, input (4, 32, 64))
at 2, 8, 24 and 48 layers (``stack2`` ...), and Hugging Face GPT-2 and Llama with 12 layers at
their default settings otherwise (attention implementation, dropout, activations), at a small
hidden size (GPT-2: 128, 4 heads; Llama: 128, 4 heads, MLP 344), vocabulary 1000, input (4, 64).

Contenders: ``eager``; ``inductor`` (``torch.compile``); ``training`` (passkit's default
pipeline); ``training-regions`` (the same with the ``regions`` step
added: repeated layers outlined, docs/regions.md).

Method: every compile runs in a fresh subprocess with ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``,
a fresh ``TORCHINDUCTOR_CACHE_DIR`` and a fresh ``PASSKIT_CACHE_DIR``; the subprocess first pays
first-use costs (imports, registries) by compiling a tiny MLP with the same contender, then
times the first training step of the workload (Dynamo, the backend, forward and backward
compilation): that is the COMPILE figure. It then takes ``--steps`` more steps and reports their
median (the STEP figure; each contender in its own process, so it carries the host's drift:
``--paired`` judges step time head to head instead). Contenders run interleaved, in an order
that rotates each round; medians over ``--rounds`` are printed, and ratios to Inductor.

``--paired WORKLOAD`` instead compiles ``training-regions`` and ``training`` in one process and
times their steps head to head (``paired.py``: ``A B B A`` blocks, median of the ratios).

Run: ``python benchmarks/compile_depth.py [--workloads stack2,stack8,stack24,stack48,gpt2,llama]
[--contenders eager,inductor,training-regions,training] [--rounds 1] [--steps 5] [--threads 2]
[--json OUT]`` or ``python benchmarks/compile_depth.py --paired stack24 [--pairs 20]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REGIONS = """
[pipeline]
name = "training-regions"
extends = "training"

[[steps]]
pass = "regions"
before = "functionalize"

"""
CONTENDERS = ["eager", "inductor", "training-regions", "training"]
WORKLOADS = ["stack2", "stack8", "stack24", "stack48", "gpt2", "llama"]


def build(name: str) -> tuple[Any, tuple[Any, ...]]:
    import torch

    torch.manual_seed(0)
    if name.startswith("stack"):
        from passkit.examples import transformer

        return transformer.TransformerStack(int(name[len("stack"):]), 64, 4), (torch.randn(4, 32, 64),)
    import transformers

    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=12, n_head=4, n_embd=128, vocab_size=1000, n_positions=128)
        model = transformers.GPT2LMHeadModel(config)
    elif name == "llama":
        config = transformers.LlamaConfig(hidden_size=128, intermediate_size=344, num_hidden_layers=12,
                                          num_attention_heads=4, num_key_value_heads=4, vocab_size=1000)
        model = transformers.LlamaForCausalLM(config)
    else:
        raise SystemExit(f"compile_depth.py: unknown workload {name!r} (one of {', '.join(WORKLOADS)})")

    class LM(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner.train()

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=ids).logits

    return LM(model), (torch.randint(0, 1000, (4, 64)),)


def compiler(contender: str, regions_file: str) -> Callable[[Any], Any]:
    import torch

    import passkit

    if contender == "eager":
        return lambda m: m
    if contender == "inductor":
        return lambda m: torch.compile(m, backend="inductor")
    pipeline = "training" if contender == "training" else regions_file
    return lambda m: passkit.compile(m, pipeline=pipeline, cache="off")


def train_step(model: Any, inputs: tuple[Any, ...]) -> None:
    import torch

    for p in model.parameters():
        p.grad = None
    out = model(*inputs)
    (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum().backward()


def child(workload: str, contender: str, steps: int, threads: int, regions_file: str) -> dict[str, Any]:
    """One cold compile and ``steps`` timed steps, in this (fresh) process."""
    import torch

    torch.set_num_threads(threads)
    compile_fn = compiler(contender, regions_file)
    tiny = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    train_step(compile_fn(tiny), (torch.randn(4, 8),))  # first-use costs, outside the figure
    torch._dynamo.reset()
    model, inputs = build(workload)
    compiled = compile_fn(model)
    started = time.perf_counter()
    train_step(compiled, inputs)
    compile_s = time.perf_counter() - started
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        train_step(compiled, inputs)
        times.append(time.perf_counter() - started)
    result: dict[str, Any] = {"compile_s": compile_s, "step_s": statistics.median(times) if times else None}
    reports = getattr(compiled, "passkit_reports", None)
    if reports:
        record = next((r for r in reports[0].records if r.id == "regions"), None)
        result["regions"] = record.stats.get("repeats") if record is not None and record.status == "ran" else None
    return result


def run_child(workload: str, contender: str, steps: int, threads: int, regions_file: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1", "PASSKIT_CACHE_DIR": f"{scratch}/passkit",
               "TORCHINDUCTOR_CACHE_DIR": f"{scratch}/inductor", "PYTHONWARNINGS": "ignore"}
        command = [sys.executable, __file__, "--child", workload, contender, "--steps", str(steps),
                   "--threads", str(threads), "--regions-file", regions_file]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:200]}
    return json.loads(lines[-1])


def paired(workload: str, pairs: int, threads: int, regions_file: str) -> None:
    import torch

    from paired import head_to_head

    torch.set_num_threads(threads)
    os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    model, inputs = build(workload)
    regions = compiler("training-regions", regions_file)(copy.deepcopy(model))
    flat = compiler("training", regions_file)(copy.deepcopy(model))
    for compiled in (regions, flat, regions, flat):
        train_step(compiled, inputs)
    ratio = head_to_head(lambda: train_step(regions, inputs), lambda: train_step(flat, inputs), pairs, min_seconds=3.0)
    print(f"{workload}: step of training-regions / training, head to head: {ratio} ({ratio.pairs} pairs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--paired", metavar="WORKLOAD")
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "CONTENDER"), help=argparse.SUPPRESS)
    parser.add_argument("--regions-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.child:
        print(json.dumps(child(*args.child, args.steps, args.threads, args.regions_file)))
        return 0
    workloads = [w for w in args.workloads.split(",") if w]
    contenders = [c for c in args.contenders.split(",") if c]
    for name in [*workloads, *contenders]:
        if name not in WORKLOADS + CONTENDERS:
            print(f"compile_depth.py: unknown workload or contender {name!r}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as scratch:
        regions_file = str(Path(scratch) / "training-regions.toml")
        Path(regions_file).write_text(REGIONS)
        if args.paired:
            paired(args.paired, args.pairs, args.threads, regions_file)
            return 0
        results: dict[str, dict[str, list[dict[str, Any]]]] = {w: {c: [] for c in contenders} for w in workloads}
        for round_index in range(args.rounds):
            for workload in workloads:
                shift = round_index % len(contenders)
                for contender in contenders[shift:] + contenders[:shift]:
                    result = run_child(workload, contender, args.steps, args.threads, regions_file)
                    results[workload][contender].append(result)
                    print(f"  round {round_index + 1} {workload} {contender}: {result}", file=sys.stderr, flush=True)
    print_table(results, contenders)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def print_table(results: dict[str, dict[str, list[dict[str, Any]]]], contenders: list[str]) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"cold compile (first step) and step time, medians; load average {load:.2f}")
    header = f"{'workload':<9}" + "".join(f"  {c + ' compile':>24}  {c + ' step':>20}" for c in contenders)
    print(header)
    for workload, by_contender in results.items():
        base = _median(by_contender.get("inductor", []), "compile_s")
        cells = []
        for contender in contenders:
            runs = by_contender[contender]
            compile_s, step_s = _median(runs, "compile_s"), _median(runs, "step_s")
            ratio = f" (x{compile_s / base:.2f})" if compile_s and base else ""
            cells.append(f"  {(f'{compile_s:.1f} s' if compile_s else 'failed') + ratio:>24}  "
                         f"{(f'{step_s * 1000:.1f} ms' if step_s else '-'):>20}")
        print(f"{workload:<9}" + "".join(cells))
        found = next((run.get("regions") for run in by_contender.get("training-regions", []) if run.get("regions")), None)
        if found:
            print(f"{'':<9}  regions: {found}")


if __name__ == "__main__":
    raise SystemExit(main())
