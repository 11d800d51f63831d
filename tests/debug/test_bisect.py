"""Bisection is a should-run plugin; it names the first bad step and a minimal pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest

import passkit
import planted_bugs
from passkit.debug.bisect import write_minimal
from passkit.debug.trial import StepFilter
from passkit.debug.bisect_model import bisect_model
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.plugins import get_plugin_manager
from passkit.core.registry import get_registry
from tiny_programs import Kit, make_program

FIXED_TRAINING = str(Path(__file__).resolve().parent / "fixed_training.toml")


@graph_pass("test.touch")
def touch(program) -> bool:
    """Do nothing."""
    return False


class _Touch:
    @hookimpl
    def passkit_register_passes(self):
        return [touch]


def test_the_step_filter_skips_steps_past_its_limit_and_the_ones_left_out() -> None:
    kit = Kit(_Touch())
    kit.pm.register(StepFilter(limit=3, leave_out=frozenset({1})), name="bisect")
    pipeline = kit.pipeline(*({"pass": "test.touch", "id": f"s{i}"} for i in range(4)))
    report = kit.run(pipeline, make_program())
    assert [(r.id, r.status, r.reason) for r in report.records] == [
        ("s0", "ran", ""), ("s1", "skipped", "bisect: left out"), ("s2", "ran", ""), ("s3", "skipped", "bisect: past step 3"),
    ]


@pytest.fixture
def planted(register_passkit_plugin, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    return tmp_path


def _pipeline(folder: Path, step: str, *, after: str, base: str = FIXED_TRAINING) -> passkit.Pipeline:
    path = folder / "planted.toml"
    path.write_text(f'[pipeline]\nname = "planted"\nextends = "{base}"\n\n[[steps]]\npass = "{step}"\nafter = "{after}"\n')
    return passkit.load_pipeline(str(path))


@pytest.mark.slow
def test_bisect_names_the_scaled_add_and_leaves_out_the_steps_it_does_not_need(planted) -> None:
    pipeline = _pipeline(planted, "planted.scale_add", after="joint")
    results, _ = bisect_model(pipeline, "planted_bugs:tiny", pm=get_plugin_manager(), registry=get_registry())
    (result,) = results
    assert pipeline.where(result.first_bad) == "planted.toml: steps[0] (planted.scale_add)"
    assert result.outcome.kind == "numerics"
    assert result.outcome.message.startswith("changed numerics: max |diff| ")
    # decompose and joint are not needed to show the scaled add; codegen.python makes it a pipeline.
    assert [s.id for s in result.minimal] == ["functionalize", "planted.scale_add", "codegen.python"]
    # Binary search: the whole pipeline, then halves; then leaving out each optional step, with the
    # bad step (it must still fail) and without it (the rest must still be good; [1, 2] is known).
    assert [t["steps"] for t in result.trials] == [
        [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4], [1, 2], [1, 2, 3], [1, 2, 4], [1, 4], [1],
    ]
    assert [t["outcome"] for t in result.trials] == ["numerics", "numerics", "good", "good", "numerics", "numerics", "good"]
    path = write_minimal(pipeline, result, planted / "minimal.toml")
    minimal = passkit.load_pipeline(str(path))
    assert (minimal.settings.verify, [s.id for s in minimal.steps]) == (
        "numerics", ["functionalize", "planted.scale_add", "codegen.python"]
    )


@pytest.mark.slow
def test_bisect_finds_a_crash_and_reports_every_step_good_without_one(planted) -> None:
    pipeline = _pipeline(planted, "planted.explode", after="fx.cse", base="inference-python")
    results, _ = bisect_model(pipeline, "planted_bugs:tiny", pm=get_plugin_manager(), registry=get_registry())
    assert pipeline.where(results[-1].first_bad) == "planted.toml: steps[0] (planted.explode)"
    assert results[-1].outcome.kind == "crash"
    assert results[-1].outcome.message == (
        "planted.toml: steps[0] (planted.explode) failed: RuntimeError: planted failure "
        "(after: functionalize, decompose, fx.cse)"
    )
    assert [s.id for s in results[-1].minimal] == ["planted.explode", "codegen.python"]
    clean, _ = bisect_model(passkit.load_pipeline("inference-python"), "planted_bugs:tiny",
                            pm=get_plugin_manager(), registry=get_registry())
    assert clean[-1].first_bad is None
    assert [t["outcome"] for t in clean[-1].trials] == ["good"]


def test_bisect_names_the_first_bad_step_of_an_export_pipeline(planted) -> None:
    pipeline = _pipeline(planted, "planted.scale_add", after="decompose", base="export")
    results, graphs = bisect_model(pipeline, "planted_bugs:tiny", pm=get_plugin_manager(), registry=get_registry())
    assert [graph.label for graph in graphs] == ["exported program, inference"]
    (result,) = results
    assert pipeline.where(result.first_bad) == "planted.toml: steps[0] (planted.scale_add)"
    assert result.outcome.kind == "numerics"
    assert [s.id for s in result.minimal] == ["functionalize", "planted.scale_add"]
    minimal = passkit.load_pipeline(str(write_minimal(pipeline, result, planted / "minimal.toml")))
    assert (minimal.kind, [s.id for s in minimal.steps]) == ("export", ["functionalize", "planted.scale_add"])


def test_a_minimal_pipeline_keeps_the_steps_its_later_steps_need_to_load(planted) -> None:
    """The crash shows without functionalize, but the decompose after it needs that step's fact."""
    pipeline = _pipeline(planted, "planted.explode", after="functionalize", base="inference-python")
    results, _ = bisect_model(pipeline, "planted_bugs:tiny", pm=get_plugin_manager(), registry=get_registry())
    assert results[-1].outcome.kind == "crash"
    minimal = passkit.load_pipeline(str(write_minimal(pipeline, results[-1], planted / "minimal.toml")))
    assert [s.id for s in minimal.steps] == ["functionalize", "planted.explode", "codegen.python"]
