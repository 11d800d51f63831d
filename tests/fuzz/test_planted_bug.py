"""A pass with a planted bug (it drops in-place writes' write-back) is found by fuzzing it alone,
reduced to a program of a few ops, blamed on its step, and written as a reproducer that
``passkit repro`` replays; ``fuzz_pass`` fails naming all of it."""

from __future__ import annotations

from pathlib import Path

import pytest

import passkit
import planted_write_back
from passkit.core.plugins import get_plugin_manager
from passkit.core.registry import get_registry
from passkit.debug.alone import pipeline_alone
from passkit.debug.replay import replay
from passkit.fuzz.session import fuzz
from passkit.testing import fuzz_pass

pytestmark = pytest.mark.slow


@pytest.fixture
def planted() -> None:
    pm = get_plugin_manager()
    pm.register(planted_write_back, name="planted_write_back")
    yield
    pm.unregister(planted_write_back)


def test_fuzzing_finds_the_dropped_write_back_reduces_it_and_names_the_step(planted, tmp_path: Path) -> None:
    registry, pm = get_registry(), get_plugin_manager()
    alone = pipeline_alone(passkit.load_pipeline("training-python"), "planted.drop_write_back", registry)
    assert [s.id for s in alone.steps] == ["functionalize", "planted.drop_write_back", "joint", "partition.default", "codegen.python"]
    summary = fuzz(alone, seed=0, programs_count=12, out=tmp_path, pm=pm, registry=registry, max_cases=1)
    assert summary.differences >= 1 and summary.invalid + summary.compiled + summary.skipped <= summary.generated
    (case,) = summary.cases
    assert len(case.program.nodes) <= 5
    assert case.first_bad_step == "training-python-planted.drop_write_back-alone: steps[1] (planted.drop_write_back)"
    assert case.bad_kind == "numerics"
    source = (Path(case.folder) / "program.py").read_text()
    assert source == case.program.source() and "_(" in source  # an in-place write is what it keeps
    replayed = replay(Path(case.reproducer), pm=pm, registry=registry)
    assert replayed.reproduced and replayed.kind == "numerics"
    assert "planted.drop_write_back" in (Path(case.folder) / "minimal.toml").read_text()


def test_fuzz_pass_fails_with_the_minimal_program_and_the_step(planted, tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        fuzz_pass("planted.drop_write_back", programs=12, out=tmp_path)
    message = str(failed.value)
    assert "first bad step: training-python-planted.drop_write_back-alone: steps[1] (planted.drop_write_back) (numerics)" in message
    assert "    def forward(self" in message and "reproducer: " in message


def test_fuzz_pass_passes_for_a_good_pass() -> None:
    summary = fuzz_pass("fx.dce", programs=8)
    assert summary.differences == 0 and summary.generated == 8
