"""Time a mixture-of-experts block's training step: eager, torch.compile and passkit pipelines.

The block routes each token to one expert (``torch.nonzero(idx == i)`` picks an expert's rows,
``index_add`` puts its output back), so every expert's row count is an unbacked size, compiled
under ``torch._dynamo.config.capture_dynamic_output_shape_ops = True`` as one graph. The method is
``step_time.py``'s: each contender compiles cold on its own copy (compile time: median of
``--compile-repeats``), then rounds in rotating order time one step each (median and minimum),
and ``--pairs`` ``A B B A`` blocks time ``passkit:training`` head to head against Inductor and
eager (``paired.py``). A step is: zero the grads, forward, ``(out ** 2).mean()``, backward.

Run: ``python benchmarks/moe.py [PIPELINE ...] [--rounds 30] [--pairs 10] [--threads 2]
[--compile-repeats 1] [--tokens 512] [--dim 256] [--experts 8]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from passkit.examples.moe import MoE

sys.path.insert(0, str(Path(__file__).resolve().parent))

from paired import repetitions  # noqa: E402
from step_time import (  # noqa: E402
    DEFAULT_PIPELINES,
    Placement,
    WorkloadResult,
    build_contenders,
    disable_compile_caches,
    machine,
    print_table,
    time_head_to_head,
    time_rounds,
    warm_up,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipelines", nargs="*", default=DEFAULT_PIPELINES)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--pairs", type=repetitions, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile-repeats", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--experts", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    torch._dynamo.config.capture_scalar_outputs = True

    def factory() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(0)
        return MoE(args.dim, args.experts), (torch.randn(args.tokens, args.dim),)

    info = machine_line()
    print(info)
    with tempfile.TemporaryDirectory(prefix="moe-inductor-") as scratch:
        disable_compile_caches(scratch)
        warm_up(args.pipelines)
        notes: list[str] = []
        contenders = build_contenders(factory, args.pipelines, notes, args.compile_repeats)
        time_rounds(contenders, args.rounds)
        subject = "passkit:training" if "training" in args.pipelines else f"passkit:{args.pipelines[0]}"
        paired = time_head_to_head({c.name: c for c in contenders}, subject, args.pairs)
    figures: dict[str, dict[str, Any]] = {
        c.name: {"median_ms": c.median_s * 1e3, "min_ms": c.min_s * 1e3, "compile_s": c.compile_s} for c in contenders
    }
    for name, ratios in paired.items():
        figures[name].update(ratios)
    workload = f"moe: {args.tokens} tokens, d={args.dim}, {args.experts} experts, top-1"
    print_table(WorkloadResult(workload, args.rounds, args.compile_repeats, figures, notes))
    return 0


def machine_line() -> str:
    info = machine(Placement())
    load = info["load_average_1min"]
    line = f"machine: {info['cpu']}; {info['threads']} threads; torch {info['torch']}"
    # With two cores shared, another busy process makes the step times jump.
    return line if load is None else f"{line}; load average at start: {load:.2f}"


if __name__ == "__main__":
    sys.exit(main())
