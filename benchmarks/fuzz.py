"""Fuzz pipelines for longer than CI does: programs per second, and what was found.

For each pipeline, ``passkit fuzz``'s session (``passkit.fuzz.session.fuzz``) draws programs from
one seed for a time budget (or a count), reduces each new difference to a minimal program,
bisects it and writes it under ``--out``. Prints one row per pipeline (generated, invalid,
compiled, skipped because torch's path fails too, differences, seconds, programs per second),
then each finding: its kind, first message, minimal program size, first bad step and folder.

Run: ``python benchmarks/fuzz.py [--pipelines training-python,inference-python,export]
[--time 10m | --programs N] [--seed S] [--out DIR]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from passkit.cli.fuzz import parse_duration
from passkit.core.plugins import get_plugin_manager
from passkit.core.registry import get_registry
from passkit.frontends.api import load_pipeline
from passkit.fuzz.session import fuzz


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pipelines", default="training-python,inference-python,export")
    parser.add_argument("--time", default="5m", help="budget per pipeline (ignored with --programs)")
    parser.add_argument("--programs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="passkit-fuzz-benchmark")
    args = parser.parse_args()
    pm, registry = get_plugin_manager(), get_registry()
    seconds = None if args.programs is not None else parse_duration(args.time)
    header = f"{'pipeline':18} {'generated':>9} {'invalid':>7} {'compiled':>8} {'skipped':>7} {'differ':>6} {'seconds':>8} {'prog/s':>7}"
    rows, findings = [header], []
    for name in args.pipelines.split(","):
        summary = fuzz(load_pipeline(name), seed=args.seed, programs_count=args.programs, seconds=seconds,
                       out=Path(args.out) / name, pm=pm, registry=registry, progress=print, every=30.0)
        rows.append(f"{name:18} {summary.generated:9d} {summary.invalid:7d} {summary.compiled:8d} {summary.skipped:7d} "
                    f"{summary.differences:6d} {summary.seconds:8.0f} {summary.per_second:7.2f}")
        for case in summary.cases:
            findings.append(f"{name}: {case.verdict.kind}: {case.verdict.message[:160]}\n"
                            f"    {len(case.program.nodes)} op(s) (from {case.original_ops}), "
                            f"{case.first_bad_step or case.note}; {case.folder}")
    print("\n".join(rows))
    print("\n".join(findings) if findings else "no differences")


if __name__ == "__main__":
    main()
