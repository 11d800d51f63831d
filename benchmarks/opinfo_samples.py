"""Time torch's own ``aot_autograd_check`` over every sample of OpInfo entries, compiled by passkit.

The check is the one ``tests/sweep/test_aot_autograd_all_samples.py`` runs: for each sample of
an entry (float32, CPU, ``requires_grad=True``), ``torch.testing._internal.optests.aot_autograd``
compares eager with ``passkit.aot_function(fn, pipeline=...)``, outputs and gradients. Each
entry runs twice in one process, as in the test: ``cold`` with an empty compile cache folder of
its own, then ``cached`` from the entries the cold pass wrote.

Per entry it prints the samples, the seconds of each pass and their sum, the compiles (one
``aot_function`` per sample and pass), how many the cache answered, the failing samples, and
the seconds the compiles' reports give: steps run (``Report.seconds``, cold) and entries loaded
(``Report.load_seconds``, cached); what is left is capture, the cache key, the runtime and
torch's check itself (eager runs, comparisons). ``--steps`` adds each step's summed seconds over
the cold pass. Target (issue #51): cold plus cached under 60 s for ``nn.functional.max_pool2d``
(1,440 samples) on the 2-core CPU machine; exit status 1 when an entry has a failing sample or,
with ``--target``, takes longer.

Run: ``python benchmarks/opinfo_samples.py [ENTRY ...] [--pipeline training-python] [--every N]
[--steps] [--target SECONDS]`` (default entry ``nn.functional.max_pool2d``; ``--every 10``
checks every tenth sample, for a quick look).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
import warnings
from typing import Any

import torch
import torch.testing._internal.optests.aot_autograd as optests_aot
from torch.testing._internal.common_methods_invocations import op_db

import passkit

DEFAULT_ENTRIES = ["nn.functional.max_pool2d"]


def entry(name: str) -> Any:
    """The OpInfo whose name (with its variant, ``name.variant``) is ``name``."""
    for op in op_db:
        if op.name + (f".{op.variant_test_name}" if op.variant_test_name else "") == name:
            return op
    raise SystemExit(f"no OpInfo entry named {name!r}")


def check_samples(op: Any, samples: list[Any], pipeline: str, reports: list[Any]) -> list[str]:
    """Run torch's check over ``samples`` with passkit compiling; the failing samples' lines."""

    def compiled_function(fn: Any, *args: Any, **kwargs: Any) -> Any:
        compiled = passkit.aot_function(fn, pipeline=pipeline)
        reports.append(compiled.passkit_reports)  # filled when the check first calls it
        return compiled

    original = optests_aot.compiled_function
    optests_aot.compiled_function = compiled_function
    failures = []
    try:
        for i, sample in enumerate(samples):
            try:
                optests_aot.aot_autograd_check(
                    op.op, (sample.input, *sample.args), sample.kwargs, dynamic=False, check_gradients=True
                )
            except Exception as exc:  # noqa: BLE001 - every sample's verdict, then the count
                failures.append(f"sample {i}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    finally:
        optests_aot.compiled_function = original
    return failures


def measure(name: str, pipeline: str, every: int, show_steps: bool) -> tuple[float, bool]:
    """Print one entry's figures; return its total seconds and whether every sample passed."""
    op = entry(name)
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=True))[::every]
    passes = {}
    ok = True
    with tempfile.TemporaryDirectory() as folder:
        os.environ["PASSKIT_CACHE_DIR"] = folder
        for label in ("cold", "cached"):
            nested: list[list[Any]] = []
            started = time.perf_counter()
            failures = check_samples(op, samples, pipeline, nested)
            seconds = time.perf_counter() - started
            reports = [report for found in nested for report in found]
            passes[label] = (seconds, reports, failures)
            ok = ok and not failures
    total = sum(seconds for seconds, _, _ in passes.values())
    print(f"{name} ({pipeline}): {len(samples)} samples, {total:.1f} s")
    for label, (seconds, reports, failures) in passes.items():
        hits = sum(report.cache == "hit" for report in reports)
        steps = sum(report.seconds for report in reports if report.cache != "hit")
        loads = sum(getattr(report, "load_seconds", 0.0) or 0.0 for report in reports if report.cache == "hit")
        print(f"  {label:<6} {seconds:7.1f} s  {len(reports)} compiles ({hits} from the cache), "
              f"steps {steps:.1f} s, loads {loads:.1f} s, {len(failures)} failing samples")
        for line in failures[:10]:
            print(f"    {line}")
    if show_steps:
        per_step: collections.Counter[str] = collections.Counter()
        for report in passes["cold"][1]:
            if report.cache == "hit":  # its records are the stored compile's
                continue
            for record in report.records:
                per_step[record.id] += record.seconds
        for step, seconds in per_step.most_common():
            print(f"    {step:<24} {seconds:6.2f} s")
    return total, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("entries", nargs="*", default=DEFAULT_ENTRIES, help="OpInfo entries (name.variant)")
    parser.add_argument("--pipeline", default="training-python")
    parser.add_argument("--every", type=int, default=1, help="check every Nth sample only")
    parser.add_argument("--steps", action="store_true", help="each step's seconds over the cold pass")
    parser.add_argument("--target", type=float, default=None, help="seconds an entry may take (exit 1 past it)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs")
    failed = False
    for name in args.entries:
        total, ok = measure(name, args.pipeline, args.every, args.steps)
        if not ok or (args.target is not None and total > args.target):
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
