"""Measure where a small model's training step goes: passkit's compiled code, its runtime, Dynamo.

Contenders, on one workload of ``step_time.py`` (default: the MLP, whose step is short enough
that per-call costs show):

- ``eager``: the model itself;
- ``passkit.compile``: through Dynamo, as ``step_time.py`` runs it;
- ``passkit.aot_module``: passkit's entry without Dynamo (``make_fx``, a cache keyed on the
  inputs' shapes and strides);
- ``compiled program``: the callable ``passkit.compile`` handed to Dynamo, called with the same
  flat inputs Dynamo passes it: passkit's runtime and compiled graphs, with no frame around them;
- ``inductor``: ``torch.compile(backend="inductor")``.

Each contender's step is timed head to head against eager's (``paired.head_to_head``: adjacent
pairs, median and quartiles), and its forward and backward alone are timed over interleaved
rounds (medians, microseconds). The gap between ``passkit.compile`` and ``compiled program`` is
Dynamo's frame (guards, its wrappers), which ``torch.compile`` pays with any backend.

Run: ``python benchmarks/call_overhead.py [--workload mlp] [--threads 2] [--rounds 9]``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import paired  # noqa: E402
import step_time  # noqa: E402

import passkit  # noqa: E402
from passkit.runtime import wrapper as runtime

CALLS_PER_ROUND = 300
WARMUP_CALLS = 50


def frame_inputs(compiled: Any, x: torch.Tensor) -> tuple[runtime.CompiledProgram, tuple[Any, ...]]:
    """The compiled program Dynamo calls, and the flat inputs it passes (parameters and ``x``)."""
    seen: dict[str, Any] = {}
    original = runtime.CompiledProgram.__call__

    def spy(self: runtime.CompiledProgram, *args: Any) -> tuple[Any, ...]:
        seen.update(program=self, args=args)
        return original(self, *args)

    runtime.CompiledProgram.__call__ = spy  # type: ignore[method-assign]
    try:
        compiled(x)
    finally:
        runtime.CompiledProgram.__call__ = original  # type: ignore[method-assign]
    return seen["program"], seen["args"]


def contenders(workload: str) -> tuple[dict[str, Callable[[], Any]], torch.Tensor]:
    """Each contender's forward, as a callable returning the model's output."""
    factory, _ = step_time.WORKLOADS[workload]
    model, (x,) = factory()
    compiled = passkit.compile(copy.deepcopy(model), pipeline="training", cache="off")
    aot = passkit.aot_module(copy.deepcopy(model), pipeline="training")
    inductor = torch.compile(copy.deepcopy(model), backend="inductor")
    for forward in (compiled, aot, inductor):
        (forward(x) ** 2).mean().backward()  # compile now, outside the timings
    program, args = frame_inputs(compiled, x)
    return {
        "eager": lambda: model(x),
        "passkit.compile": lambda: compiled(x),
        "passkit.aot_module": lambda: aot(x),
        "compiled program": lambda: program(*args)[0],
        "inductor": lambda: inductor(x),
    }, x


def step_of(forward: Callable[[], Any]) -> Callable[[], None]:
    def step() -> None:
        (forward() ** 2).mean().backward()

    return step


def forward_and_backward_us(forward: Callable[[], Any], calls: int) -> tuple[float, float]:
    """Mean microseconds of one forward and of one backward over ``calls`` steps."""
    forward_s = backward_s = 0.0
    for _ in range(calls):
        started = time.perf_counter()
        loss = (forward() ** 2).mean()
        middle = time.perf_counter()
        loss.backward()
        forward_s += middle - started
        backward_s += time.perf_counter() - middle
    return forward_s / calls * 1e6, backward_s / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="mlp", choices=list(step_time.WORKLOADS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds of the forward/backward split")
    parser.add_argument("--seconds", type=float, default=3.0, help="head to head against eager, per contender")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    forwards, _ = contenders(args.workload)
    for forward in forwards.values():
        forward_and_backward_us(forward, WARMUP_CALLS)
    split: dict[str, list[tuple[float, float]]] = {name: [] for name in forwards}
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}/{args.rounds}", file=sys.stderr, flush=True)
        for name, forward in forwards.items():
            split[name].append(forward_and_backward_us(forward, CALLS_PER_ROUND))
    eager_step = step_of(forwards["eager"])
    print(f"{args.workload}, {args.threads} threads, torch {torch.__version__}")
    print(f"{'contender':<20} {'forward us':>11} {'backward us':>12}  step vs eager, head to head")
    for name, forward in forwards.items():
        fwd = statistics.median(f for f, _ in split[name])
        bwd = statistics.median(b for _, b in split[name])
        ratio = "x1 (itself)" if name == "eager" else str(
            paired.head_to_head(step_of(forward), eager_step, repetitions=10, min_seconds=args.seconds))
        print(f"{name:<20} {fwd:>11.1f} {bwd:>12.1f}  {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
