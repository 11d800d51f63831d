"""Inside a bad ``rewrite`` step, bisection goes on to the first bad pattern application."""

from __future__ import annotations

from pathlib import Path

import pytest

import passkit
import planted_bugs
from passkit.debug.bisect import confirm, write_minimal
from passkit.debug.bisect_model import bisect_model
from passkit.core.plugins import get_plugin_manager
from passkit.core.registry import get_registry

FIXED_TRAINING = str(Path(__file__).resolve().parent / "fixed_training.toml")
# The model line that makes the add the planted pattern scales first.
ADD_LINE = f"planted_bugs.py:{Path(planted_bugs.__file__).read_text().splitlines().index('        h = torch.relu(h) + x') + 1}"


@pytest.fixture
def planted(register_passkit_plugin, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    return tmp_path


def _pipeline(folder: Path, patterns: str, *, after: str = "functionalize", extra: str = "") -> passkit.Pipeline:
    path = folder / "patterns.toml"
    path.write_text(
        f'[pipeline]\nname = "patterns"\nextends = "{FIXED_TRAINING}"\n\n'
        f'[[steps]]\npass = "rewrite"\npatterns = {patterns}\nafter = "{after}"\n{extra}'
    )
    return passkit.load_pipeline(str(path))


@pytest.mark.slow
def test_bisect_names_the_first_bad_pattern_application_among_good_ones(planted) -> None:
    pipeline = _pipeline(planted, '["noops", "planted"]')
    results, graphs = bisect_model(pipeline, "planted_bugs:chain", pm=get_plugin_manager(), registry=get_registry())
    (result,) = results
    assert pipeline.where(result.first_bad) == "patterns.toml: steps[0] (rewrite)"
    assert result.outcome.kind == "numerics"
    # In node order: noops removes the reshape and the * 1 (applications 1 and 2), then the
    # planted pattern scales the first residual add (3); three more follow.
    assert result.pattern_application == passkit.Application(
        index=3, kind="pattern", name="planted:scale_add", group="planted", graph="main", nodes=("add",), source=ADD_LINE
    )
    assert result.applications == 6
    searched = [(t["steps"], t.get("applications"), t["outcome"]) for t in result.trials if "applications" in t]
    assert searched == [([1, 2], 0, "good"), ([1, 2], 3, "numerics"), ([1, 2], 1, "good"), ([1, 2], 2, "good")]
    # The minimal pipeline keeps only the offending pattern, and still fails the same way.
    (rewrite,) = [s for s in result.minimal if s.id == "rewrite"]
    assert ([str(p) for p in rewrite.options.patterns], rewrite.options.only) == (["planted"], ["planted:scale_add"])
    path = write_minimal(pipeline, result, planted / "minimal.toml")
    text = path.read_text()
    assert f"# First bad application in it: planted:scale_add (application 3), graph main, nodes add ({ADD_LINE}).\n" in text
    minimal = passkit.load_pipeline(str(path))
    assert [s.id for s in minimal.steps] == ["functionalize", "rewrite", "codegen.python"]
    assert minimal.steps[1].options.only == ["planted:scale_add"]
    outcome = confirm(path, graphs[0].program, graphs[0].reference, pm=get_plugin_manager(), registry=get_registry(),
                      expected="numerics", bisection=result)
    assert (outcome.kind, outcome.repro) == ("numerics", "passkit-repro/02-rewrite")


@pytest.mark.slow
def test_expect_match_does_not_hide_the_bad_application(planted) -> None:
    # Bisection vetoes every application in its first trial; a vetoed match still counts as a
    # match, so expect_match does not fail that trial and the search goes on to one application.
    pipeline = _pipeline(planted, '["planted"]', extra="expect_match = true\n")
    results, _ = bisect_model(pipeline, "planted_bugs:chain", pm=get_plugin_manager(), registry=get_registry())
    (result,) = results
    assert pipeline.where(result.first_bad) == "patterns.toml: steps[0] (rewrite)"
    assert result.pattern_application == passkit.Application(
        index=1, kind="pattern", name="planted:scale_add", group="planted", graph="main", nodes=("add",), source=ADD_LINE
    )
    searched = [(t.get("applications"), t["outcome"]) for t in result.trials if "applications" in t]
    assert searched[0] == (0, "good")


@pytest.mark.slow
def test_a_good_rewrite_step_is_not_blamed_and_a_bad_step_without_patterns_names_no_application(planted) -> None:
    pipeline = _pipeline(planted, '["noops"]')
    results, _ = bisect_model(pipeline, "planted_bugs:chain", pm=get_plugin_manager(), registry=get_registry())
    assert results[-1].first_bad is None
    path = planted / "with_pass.toml"
    path.write_text(
        f'[pipeline]\nname = "p"\nextends = "{planted / "patterns.toml"}"\n\n'
        '[[steps]]\npass = "planted.scale_add"\nafter = "joint"\n'
    )
    bad_pass = passkit.load_pipeline(str(path))
    results, _ = bisect_model(bad_pass, "planted_bugs:chain", pm=get_plugin_manager(), registry=get_registry())
    assert bad_pass.where(results[-1].first_bad) == "with_pass.toml: steps[0] (planted.scale_add)"
    assert (results[-1].pattern_application, results[-1].applications) == (None, 0)
