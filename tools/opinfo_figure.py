"""Regenerate the exactness figure: how many of torch's OpInfo/ModuleInfo entries passkit runs exactly.

    PYTHONPATH=$PWD python tools/opinfo_figure.py [--full] [--json out.json] [--only NAME ...]

Each swept op (autograd-capable, float32 on the CPU) and module runs through
``passkit.aot_function``/``aot_module`` with the ``training-python`` pipeline and is compared
with eager exactly as ``tests/sweep`` does (outputs, gradients, dtype, requires_grad, aliasing,
mutation, at torch's per-op tolerances). ``--full`` checks every sample instead of the first.
Prints one line per failure and the figure; known gaps count as failures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

# Appended, not prepended: PYTHONPATH decides which passkit is measured (a baseline checkout).
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests" / "sweep"))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


class _Timeout(Exception):
    pass


def _alarm(signum, frame):  # noqa: ANN001
    raise _Timeout("ran past the per-entry time limit")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="every sample, not only the first")
    parser.add_argument("--json", help="write per-entry results here")
    parser.add_argument("--only", nargs="*", help="only these op/module names")
    parser.add_argument("--limit-s", type=int, default=120, help="time limit per entry (seconds)")
    args = parser.parse_args()
    if args.full:
        os.environ["PASSKIT_SWEEP"] = "full"
    warnings.simplefilter("ignore")
    import opinfo_harness as harness

    entries = [(harness.op_id(op), harness.check_op, op) for op in harness.swept_ops()]
    entries += [(harness.module_id(m), harness.check_module, m) for m in harness.swept_modules()]
    if args.only:
        entries = [e for e in entries if e[0] in args.only]
    signal.signal(signal.SIGALRM, _alarm)
    results: dict[str, str] = {}
    started = time.perf_counter()
    for k, (name, check, entry) in enumerate(entries, start=1):
        signal.alarm(args.limit_s)
        try:
            check(entry)
            results[name] = "ok"
        except harness.EagerFails as exc:
            results[name] = "n/a: eager itself fails: " + _one_line(exc)
        except BaseException as exc:  # noqa: BLE001 - every failure is a result to report
            if isinstance(exc, KeyboardInterrupt):
                raise
            results[name] = _one_line(exc)
            print(f"[{k}/{len(entries)}] {name}: {results[name]}", flush=True)
        finally:
            signal.alarm(0)
    passed = sum(1 for r in results.values() if r == "ok")
    applicable = sum(1 for r in results.values() if not r.startswith("n/a"))
    seconds = time.perf_counter() - started
    mode = "every sample" if args.full else "first sample"
    print(
        f"passes {passed} of {applicable} ops and modules of torch's OpInfo/ModuleInfo databases, "
        f"exact to eager ({mode}, {harness.PIPELINE}, float32 CPU, {seconds:.0f} s; "
        f"{len(results) - applicable} more where eager itself fails the check)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
