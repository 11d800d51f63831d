"""On-device through passkit against torch's own ExecuTorch flow: the ``.pte``'s size and its
latency on the ExecuTorch runtime, against eager PyTorch.

Contenders, each delegating to XNNPACK:
- passkit: ``passkit.to_executorch(passkit.export(model, ...), path)`` (the ``edge`` pipeline);
- torch: ``to_edge_transform_and_lower(torch.export.export(model, ...), partitioner=[XnnpackPartitioner()])
  .to_executorch()``, the flow ExecuTorch documents;
- eager: the model itself under ``torch.no_grad()``.

Everything runs on one thread (``torch.set_num_threads(1)``, the runtime's thread pool reset to
one). Latency: ``--rounds`` rounds, each timing every contender over ``--calls`` calls in an
order that rotates each round; the figure is the median per-call time over rounds. Models where
torch's flow fails (Hugging Face GPT-2 and Llama at their defaults) get passkit's figures and
torch's error.

Run: ``python benchmarks/executorch.py [--models mlp,convnet,gpt2,llama] [--rounds 7] [--calls 20] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

# Python puts this file's folder first on the path, where this file would shadow the
# `executorch` package it benchmarks.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402

import passkit  # noqa: E402
from passkit import _torch  # noqa: E402


def mlp() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(256, 256), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(32, 256),), {}


def convnet() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)

    def block(cin: int, cout: int) -> list[torch.nn.Module]:
        return [torch.nn.Conv2d(cin, cout, 3, padding=1), torch.nn.BatchNorm2d(cout), torch.nn.ReLU(), torch.nn.MaxPool2d(2)]

    model = torch.nn.Sequential(*block(3, 16), *block(16, 32), *block(32, 64), torch.nn.Flatten(), torch.nn.Linear(64 * 4 * 4, 10))
    return model.eval(), (torch.randn(1, 3, 32, 32),), {}


def gpt2() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=4, n_head=4)).eval()
    return model, (), {"input_ids": torch.randint(0, 1000, (1, 64)), "use_cache": False}


def llama() -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                         intermediate_size=256, num_hidden_layers=4, max_position_embeddings=64)).eval()
    return model, (), {"input_ids": torch.randint(0, 1000, (1, 64)), "use_cache": False}


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]]] = {
    "mlp": mlp, "convnet": convnet, "gpt2": gpt2, "llama": llama,
}


def torch_flow(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bytes, Any]:
    """torch's own flow's ``.pte`` bytes, and the program it was lowered from."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    captured = torch.export.export(model, args, kwargs)
    return bytes(to_edge_transform_and_lower(captured, partitioner=[XnnpackPartitioner()]).to_executorch().buffer), captured


def passkit_flow(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], folder: Path) -> tuple[bytes, Any]:
    exported = passkit.export(model, args, kwargs, cache="off")
    path = passkit.to_executorch(exported, folder / "passkit.pte", cache="off")
    return Path(path).read_bytes(), exported


def runner(pte: bytes, exported: Any, args: tuple[Any, ...], kwargs: dict[str, Any], expected: torch.Tensor) -> Callable[[], Any]:
    """One call of the ``.pte``'s forward; checked once against eager first (a wrong program is
    not timed)."""
    method = _torch.load_pte_method(pte)
    flat = _torch.flat_user_inputs(exported, args, kwargs)
    got = method.execute(flat)[0]
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)
    return lambda: method.execute(flat)


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:110]}" if lines else type(exc).__name__


def run_model(name: str, rounds: int, calls: int, folder: Path) -> dict[str, Any]:
    model, args, kwargs = MODELS[name]()
    with torch.no_grad():
        out = model(*args, **kwargs)
    expected = out.logits if hasattr(out, "logits") else out
    contenders: dict[str, Callable[[], Any]] = {}
    result: dict[str, Any] = {"model": name}

    def eager() -> Any:
        with torch.no_grad():
            return model(*args, **kwargs)

    contenders["eager"] = eager
    for flow, make in (("passkit", lambda: passkit_flow(copy.deepcopy(model), args, kwargs, folder)),
                       ("torch", lambda: torch_flow(copy.deepcopy(model), args, kwargs))):
        try:
            started = time.perf_counter()
            pte, exported = make()
            result[f"{flow}_lower_s"] = time.perf_counter() - started
            contenders[flow] = runner(pte, exported, args, kwargs, expected)
            result[f"{flow}_bytes"] = len(pte)
        except Exception as exc:  # noqa: BLE001 - the table reports a flow that fails, and goes on
            result[f"{flow}_error"] = _one_line(exc)
    names = list(contenders)
    times: dict[str, list[float]] = {key: [] for key in names}
    for round_ in range(rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for key in order:
            started = time.perf_counter()
            for _ in range(calls):
                contenders[key]()
            times[key].append((time.perf_counter() - started) / calls)
    for key in names:
        result[f"{key}_ms"] = statistics.median(times[key]) * 1000
    return result


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| model | eager | passkit .pte | size | vs eager | torch .pte | size | vs eager |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        cells = [r["model"], f"{r['eager_ms']:.2f} ms"]
        for flow in ("passkit", "torch"):
            if f"{flow}_ms" in r:
                cells += [f"{r[f'{flow}_ms']:.2f} ms", f"{r[f'{flow}_bytes'] / 1024:.0f} KiB", f"x{r[f'{flow}_ms'] / r['eager_ms']:.2f}"]
            else:
                cells += [f"fails: {r.get(f'{flow}_error', '?')}", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", default=None)
    options = parser.parse_args()
    missing = _torch.executorch_missing()
    if missing:
        raise SystemExit(missing)
    torch.set_num_threads(1)
    _torch.set_runtime_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for name in options.models.split(","):
            results.append(run_model(name, options.rounds, options.calls, Path(folder)))
            print(json.dumps(results[-1]), file=sys.stderr)
    print(f"torch {torch.__version__}, one thread, {options.rounds} rounds of {options.calls} calls, medians")
    print(table(results))
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
