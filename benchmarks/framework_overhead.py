"""Measure passkit's own overhead: loading a pipeline, and the runner around the passes.

Prints a table with each figure, its target and PASS/FAIL:

(a) load and validate a 50-step pipeline file (fx.dce / fx.cse steps with distinct ids), after a
    warm-up that builds the registry. Each run reads a different file, so TOML is parsed every
    time rather than served from the loader's cache.
(b) the runner's overhead for 50 no-op steps on a 1,000-node graph with reports on (the timing
    instrument registered, no dumps, no verification): total runner time minus the time of the
    steps themselves as the timing instrument recorded it.

Run: ``python benchmarks/framework_overhead.py [--runs N]``. Exits 1 if a figure misses its target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import fx

from passkit.core import runner
from passkit.core.hookspecs import hookimpl
from passkit.instruments import dumps, timing, verify
from passkit.core.pass_api import graph_pass
from passkit.pipeline import Pipeline, Settings, Step, load_pipeline
from passkit.core.plugins import make_plugin_manager
from passkit.core.program import GraphIO, Program, Signature
from passkit.core.registry import build_registry, get_registry

STEPS = 50
NODES = 1000
LOAD_TARGET_S = 0.050
RUNNER_TARGET_S = 0.100


def pipeline_text(variant: int) -> str:
    lines = ["[pipeline]", f'name = "bench{variant}"', f'description = "50 cleanup steps, variant {variant}"', ""]
    for index in range(STEPS - 1):
        lines += ["[[steps]]", f'pass = "{"fx.dce" if index % 2 else "fx.cse"}"', f'id = "cleanup-{index}"', ""]
    lines += ["[[steps]]", 'pass = "codegen.python"', ""]
    return "\n".join(lines)


def measure_load(runs: int) -> float:
    registry = get_registry()  # warm-up: plugins imported, registry built
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for variant in range(runs + 1):
            path = Path(folder) / f"bench{variant}.toml"
            path.write_text(pipeline_text(variant))
            paths.append(path)
        load_pipeline(paths[0], registry=registry)  # warm-up: first-use imports in the loader
        timings = []
        for path in paths[1:]:
            started = time.perf_counter()
            pipeline = load_pipeline(path, registry=registry)
            timings.append(time.perf_counter() - started)
            assert len(pipeline.steps) == STEPS
    return statistics.median(timings)


@graph_pass("bench.noop")
def noop(program: Program) -> bool:
    """Do nothing."""
    return False


class BenchPasses:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return [noop]


def big_program() -> Program:
    graph = fx.Graph()
    x = graph.placeholder("x")
    value = x
    for _ in range(NODES - 2):
        value = graph.call_function(torch.ops.aten.add.Tensor, (value, x))
    graph.output(value)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    signature = Signature(inputs=[], outputs=[], graph_io={"main": GraphIO([], [])})
    return Program(graphs={"main": gm}, signature=signature, example_inputs=[], facts={"captured"})


def measure_runner(runs: int) -> float:
    pm = make_plugin_manager(load_entry_points=False, builtins=False)
    for name, module in (("runner", runner), ("timing", timing), ("dumps", dumps), ("verify", verify)):
        pm.register(module, name=name)
    pm.register(BenchPasses(), name="bench")
    registry = build_registry(pm)
    options = noop.options()
    steps = tuple(Step(i, f"noop-{i}", "bench.noop", options, None, True, {}) for i in range(STEPS))
    pipeline = Pipeline(name="bench", description="", source=None, settings=Settings(), settings_origin={},
                        steps=steps, files=())
    program = big_program()
    assert program.node_count() == NODES
    overheads = []
    for _ in range(runs + 1):
        started = time.perf_counter()
        report = runner.run_pipeline(pipeline, program, pm=pm, registry=registry)
        total = time.perf_counter() - started
        overheads.append(total - sum(record.seconds for record in report.records))
    return statistics.median(overheads[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per figure (median reported)")
    args = parser.parse_args()
    rows = [
        (f"load + validate a {STEPS}-step pipeline", measure_load(args.runs), LOAD_TARGET_S),
        (f"runner overhead, {STEPS} no-op steps, {NODES}-node graph", measure_runner(args.runs), RUNNER_TARGET_S),
    ]
    width = max(len(row[0]) for row in rows)
    print(f"{'figure'.ljust(width)}  {'median':>9}  {'target':>9}  result")
    print(f"{'-' * width}  {'-' * 9}  {'-' * 9}  ------")
    failed = False
    for label, seconds, target in rows:
        ok = seconds < target
        failed |= not ok
        print(f"{label.ljust(width)}  {seconds * 1000:6.1f} ms  {target * 1000:6.1f} ms  {'PASS' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
