"""Measure what reproducers cost a run that does not fail: one snapshot of the program before its
first step (a failing step rebuilds the state before it from that snapshot).

For each model, the program is captured once through Dynamo; then rounds alternate between
running the ``training-python`` pipeline on a fresh copy with ``repro_dir`` set (the default)
and with ``repro_dir = ""``. Prints the median pipeline time of each and their ratio, and the
median time of one snapshot of the captured and of the final program.

Run: ``python benchmarks/repro_overhead.py [--rounds N] [--models block,large_stack]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from passkit.frontends.api import load_pipeline
from passkit.debug.bisect_model import capture_model
from passkit.artifacts.snapshot import snapshot_program
from passkit.core.plugins import get_plugin_manager
from passkit.core.registry import get_registry
from passkit.core.runner import run_pipeline


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="block,large_stack")
    args = parser.parse_args()
    pm, registry = get_plugin_manager(), get_registry()
    base = load_pipeline("training-python")
    variants = {"repro on": base.with_settings(repro_dir="passkit-repro"), "repro off": base.with_settings(repro_dir="")}
    print(f"{'model':12} {'nodes':>6} {'repro on':>10} {'repro off':>10} {'ratio':>6} {'snapshot captured':>18} {'snapshot final':>15}")
    for name in args.models.split(","):
        (captured, *_rest) = capture_model(f"passkit.examples.transformer:{name}", base)
        times: dict[str, list[float]] = {key: [] for key in variants}
        final = None
        for _ in range(args.rounds):
            for key, pipeline in variants.items():
                program = snapshot_program(captured.program)
                started = time.perf_counter()
                run_pipeline(pipeline, program, pm=pm, registry=registry)
                times[key].append(time.perf_counter() - started)
                final = program
        snaps = {}
        for label, program in (("captured", captured.program), ("final", final)):
            samples = []
            for _ in range(5):
                started = time.perf_counter()
                snapshot_program(program)
                samples.append(time.perf_counter() - started)
            snaps[label] = statistics.median(samples)
        on, off = statistics.median(times["repro on"]), statistics.median(times["repro off"])
        print(
            f"{name:12} {final.node_count():>6} {on * 1000:>8.0f}ms {off * 1000:>8.0f}ms {on / off:>6.3f} "
            f"{snaps['captured'] * 1000:>16.1f}ms {snaps['final'] * 1000:>13.1f}ms"
        )


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
