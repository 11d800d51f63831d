"""Measure one compiled AdamW step: eager, ``torch.compile`` (Inductor) and passkit pipelines.

The model is a stack of Linear layers (``--width``, ``--layers``; by default 1792 wide and three
deep: 9.6M parameters). Its gradients are made once by one backward; a timed step is one
``opt.step()`` and nothing else. Contenders, each with its own copy of the model and its own
``AdamW(foreach=True)``:

- ``eager``: ``opt.step``;
- ``inductor``: ``torch.compile(opt.step)``;
- ``passkit:<pipeline>``: ``torch.compile(opt.step, backend=passkit.backend(pipeline, cache="off"))``
  for each pipeline named on the command line (default ``training``).

Method (as ``step_time.py``): every contender's first step compiles, cold (Inductor's caches and
passkit's compile cache off, empty kernel caches); its wall time is the COMPILE column. After two
warm-up steps the contenders are timed round by round, each round running every contender once in
an order that rotates each round; the table quotes each contender's median step and its ratio to
eager's median. Then the first passkit pipeline runs head to head against Inductor and against
eager (``paired.py``: ``A B B A`` blocks of adjacent steps, the median of their ratios), which
cancels most of a shared machine's drift.

Run: ``python benchmarks/optimizer_step.py [PIPELINE ...] [--width 1792] [--layers 3]
[--rounds 30] [--pairs 10] [--threads N] [--json OUT]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import passkit
from paired import head_to_head, repetitions
from step_time import Placement, cold_kernel_cache, disable_compile_caches, machine, time_rounds

WARMUP_STEPS = 2
HEAD_TO_HEAD_SECONDS = 3.0


def model(width: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))


@dataclass
class Contender:
    name: str
    step: Callable[[], Any]
    compile_s: float = 0.0
    times_s: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)


def build(name: str, base: torch.nn.Module, x: torch.Tensor, compile_step: Callable[[Callable[..., Any]], Any]) -> Contender:
    """A contender on its own copy of the model and optimizer; its first step compiles, cold."""
    m = copy.deepcopy(base)
    (m(x) ** 2).mean().backward()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, foreach=True)
    contender = Contender(name, compile_step(opt.step))
    started = time.perf_counter()
    with cold_kernel_cache():
        contender.step()
    contender.compile_s = time.perf_counter() - started
    for _ in range(WARMUP_STEPS):
        contender.step()
    return contender


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipelines", nargs="*", default=["training"])
    parser.add_argument("--width", type=int, default=1792)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--pairs", type=repetitions, default=10)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    disable_compile_caches(tempfile.mkdtemp(prefix="optimizer-step-"))

    base = model(args.width, args.layers)
    x = torch.randn(16, args.width)
    n_params = sum(p.numel() for p in base.parameters())
    builders: list[tuple[str, Callable[[Callable[..., Any]], Any]]] = [
        ("eager", lambda step: step),
        ("inductor", lambda step: torch.compile(step)),
    ]
    builders += [(f"passkit:{spec}", lambda step, spec=spec: torch.compile(step, backend=passkit.backend(spec, cache="off")))
                 for spec in args.pipelines]
    contenders = []
    for name, compile_step in builders:
        torch._dynamo.reset()
        contenders.append(build(name, base, x, compile_step))
    time_rounds(contenders, args.rounds)

    info = machine(Placement())
    print(f"AdamW(foreach=True) step, {args.layers} x Linear({args.width}, {args.width}): {n_params / 1e6:.1f}M parameters")
    print(f"machine: {info['cpu']}, {info['threads']} threads, torch {info['torch']}, load {info['load_average_1min']:.1f}")
    eager = contenders[0].median_s
    header = f"{'contender':<20}  {'median':>10}  {'min':>10}  {'vs eager':>8}  {'compile':>8}"
    print(f"\n{args.rounds} rounds, contenders interleaved (order rotates each round)")
    print(header)
    print("-" * len(header))
    figures: dict[str, dict[str, Any]] = {}
    for c in contenders:
        figures[c.name] = {"median_ms": c.median_s * 1e3, "min_ms": min(c.times_s) * 1e3,
                           "vs_eager": c.median_s / eager, "compile_s": c.compile_s}
        compile_text = "-" if c.name == "eager" else f"{c.compile_s:6.2f} s"
        print(f"{c.name:<20}  {c.median_s * 1e3:7.2f} ms  {min(c.times_s) * 1e3:7.2f} ms  "
              f"{c.median_s / eager:7.3f}x  {compile_text:>8}")
    subject = next((c for c in contenders if c.name.startswith("passkit:")), None)
    if subject is not None and args.pairs:
        for other in contenders[:2]:
            ratio = head_to_head(subject.step, other.step, args.pairs, HEAD_TO_HEAD_SECONDS)
            figures[subject.name][f"vs_{other.name}_paired"] = ratio.median
            print(f"head to head, {subject.name} / {other.name}: x{ratio.median:.3f} "
                  f"(quartiles {ratio.q1:.3f}-{ratio.q3:.3f}, {ratio.pairs} pairs)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "parameters": n_params, "rounds": args.rounds, "contenders": figures}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
