"""Compile count and training-step time against eager for the model zoo (tests/models/zoo.py).

Each model (small random-init Hugging Face configs at their default settings) is compiled with
``passkit.compile(model, pipeline=...)`` (default ``training-python``). A step is: zero grads,
forward with labels, ``loss.backward()``. After two warm-up steps, eager and passkit run
interleaved round by round (the order alternates each round) and the medians are printed with
their ratio; the compile count is the number of graphs passkit compiled for those steps (graph
breaks make more than one). Dropout is on, as at the defaults. The first step of each (the one
that compiles) runs from the same seed as an eager step, and ``=eager`` says whether the loss and
every gradient equal eager's (rtol 1e-4, atol 1e-5); the exit status is 1 if one does not.

Run: ``python benchmarks/model_zoo.py [--pipeline training-python] [--rounds 15] [--models a,b]
[--threads 1]``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

import passkit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
from zoo import ZOO  # noqa: E402


def _step(model: torch.nn.Module, runner: torch.nn.Module, inputs: dict) -> float:
    started = time.perf_counter()
    for p in model.parameters():
        p.grad = None
    runner(**inputs).loss.backward()
    return time.perf_counter() - started


def _same_gradients(eager: torch.nn.Module, twin: torch.nn.Module) -> bool:
    for p, q in zip(eager.parameters(), twin.parameters()):
        if (p.grad is None) != (q.grad is None):
            return False
        if p.grad is not None and not torch.allclose(q.grad, p.grad, rtol=1e-4, atol=1e-5):
            return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="training-python")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--models", default=",".join(z.name for z in ZOO))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    wanted = args.models.split(",")
    print(f"pipeline {args.pipeline}, {args.rounds} rounds, {args.threads} thread(s), torch {torch.__version__}")
    print(f"{'model':10} {'graphs':>6} {'compile s':>9} {'=eager':>6} {'eager ms':>9} {'passkit ms':>10} {'ratio':>6}")
    mismatches = 0
    for zoo in ZOO:
        if zoo.name not in wanted:
            continue
        torch._dynamo.reset()
        torch.manual_seed(0)
        eager = zoo.build()
        twin = copy.deepcopy(eager)
        compiled = passkit.compile(twin, pipeline=args.pipeline)
        torch.manual_seed(1)
        inputs = zoo.inputs(4)
        torch.manual_seed(2)  # the same dropout masks in both first steps
        _step(eager, eager, inputs)
        torch.manual_seed(2)
        compile_s = _step(twin, compiled, inputs)
        equal = _same_gradients(eager, twin)
        mismatches += not equal
        for _ in range(2):
            _step(eager, eager, inputs)
            _step(twin, compiled, inputs)
        times: dict[str, list[float]] = {"eager": [], "passkit": []}
        for round_ in range(args.rounds):
            order = [("eager", eager, eager), ("passkit", twin, compiled)]
            for name, model, runner in order if round_ % 2 == 0 else order[::-1]:
                times[name].append(_step(model, runner, inputs))
        eager_ms = statistics.median(times["eager"]) * 1e3
        passkit_ms = statistics.median(times["passkit"]) * 1e3
        graphs = len(compiled.passkit_reports)
        print(f"{zoo.name:10} {graphs:>6} {compile_s:>9.1f} {str(equal):>6} {eager_ms:>9.2f} {passkit_ms:>10.2f} "
              f"{passkit_ms / eager_ms:>6.2f}", flush=True)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
