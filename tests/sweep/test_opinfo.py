"""torch's own OpInfo and ModuleInfo databases through passkit, compared with eager.

Every op with an autograd formula and float32 CPU support (``op_db``) and every float32 module
(``module_db``) runs through ``aot_function``/``aot_module`` with ``training-python``; outputs,
gradients, dtypes, ``requires_grad``, aliasing and mutated inputs must match eager at torch's
per-op tolerances (``opinfo_harness.py``). A run checks the first sample of one shard, a third
of the entries picked by a stable hash of their names, plus every known gap wherever it falls.
The shard rotates by date (``tests/conftest.py`` picks it and the run's header names it), so
every entry is checked every three days; ``PASSKIT_SWEEP_SHARD=k/3`` picks one. ``PASSKIT_SWEEP=all``
checks every entry's first sample, and ``PASSKIT_SWEEP=full`` every sample of every entry (the
scheduled job). An entry in ``known_gaps.py`` must raise the error listed there (strict xfail
with ``raises=``): the test fails when a listed gap starts passing or starts failing otherwise,
a wrong value included.
"""

from __future__ import annotations

import pytest

import opinfo_harness as harness
from known_gaps import KNOWN_GAPS

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore")]


def _check(request: pytest.FixtureRequest, name: str, check, entry) -> None:  # noqa: ANN001
    gap = KNOWN_GAPS.get(name)
    if gap is not None:
        request.applymarker(pytest.mark.xfail(raises=gap.raises, reason=gap.reason, strict=True))
    try:
        check(entry)
    except harness.EagerFails as exc:
        pytest.skip(f"eager itself fails: {str(exc).splitlines()[0]}")


def _runs(name: str) -> bool:
    return harness.selected(name) or name in KNOWN_GAPS


@pytest.mark.parametrize("op", [op for op in harness.swept_ops() if _runs(harness.op_id(op))], ids=harness.op_id)
def test_op_matches_eager(op, request: pytest.FixtureRequest) -> None:
    _check(request, harness.op_id(op), harness.check_op, op)


@pytest.mark.parametrize(
    "module_info", [m for m in harness.swept_modules() if _runs(harness.module_id(m))], ids=harness.module_id
)
def test_module_matches_eager(module_info, request: pytest.FixtureRequest) -> None:
    _check(request, harness.module_id(module_info), harness.check_module, module_info)


def test_known_gaps_name_swept_entries() -> None:
    names = {harness.op_id(op) for op in harness.swept_ops()} | {m.name for m in harness.swept_modules()}
    assert sorted(set(KNOWN_GAPS) - names) == []
    assert all(gap.reason.strip() and issubclass(gap.raises, Exception) for gap in KNOWN_GAPS.values())
