"""``passkit fuzz``: a summary (or JSON), differences written as reproducers, exit codes as
``passkit run``'s, one-line errors for bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import planted_write_back
from passkit.cli import main

pytestmark = pytest.mark.slow


def test_fuzzing_a_planted_pass_alone_reports_the_difference_and_exits_1(cli, register_passkit_plugin, workdir: Path) -> None:
    register_passkit_plugin(planted_write_back, name="planted_write_back")
    result = cli.invoke(main, ["fuzz", "training-python", "--pass", "planted.drop_write_back", "--programs", "10", "--json"])
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout)
    assert summary["generated"] == 10 and summary["differences"] >= 1
    assert summary["generated"] == summary["invalid"] + summary["compiled"] + summary["skipped"] + summary["difference_kinds"].get("crash", 0)
    case = summary["cases"][0]
    assert case["first_bad_step"] == "training-python-planted.drop_write_back-alone: steps[1] (planted.drop_write_back)"
    assert case["ops"] <= 5 and Path(case["reproducer"]).is_dir()
    assert "fuzz: planted.drop_write_back alone: steps functionalize, planted.drop_write_back, joint, partition.default, codegen.python" in result.stderr
    # the reproducer replays the step's failure, as bisect's do
    replayed = cli.invoke(main, ["repro", case["reproducer"], "--plugin", "planted_write_back"])
    assert replayed.exit_code == 1, replayed.output


def test_a_good_pipeline_prints_the_summary_and_exits_0(cli, workdir: Path) -> None:
    result = cli.invoke(main, ["fuzz", "inference-python", "--pass", "fx.dce", "--programs", "6", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("fuzz inference-python-fx.dce-alone (seed 3): 6 generated, ")
    assert not (workdir / "passkit-fuzz").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--time", "soon"], "--time 'soon': give a positive duration such as 90s, 5m or 1h"),
    (["--time", "5m", "--programs", "3"], "passkit fuzz: give --programs N or --time DURATION, not both"),
    (["--pass", "no.such"], "--pass no.such: no such pass or step id in passkit/pipelines/training-python.toml"),
])
def test_bad_input_is_one_line_and_exit_2(cli, workdir: Path, args: list[str], message: str) -> None:
    result = cli.invoke(main, ["fuzz", "training-python", *args])
    assert result.exit_code == 2
    assert result.stderr.strip() == message


@pytest.mark.parametrize(("pipeline", "message"), [
    ("edge", 'passkit/pipelines/edge.toml: passkit fuzz compares programs it can call, and this file is an edge pipeline '
             '(kind = "edge"): it makes an ExecuTorch program; fuzz a pipeline that compiles or exports, such as \'training\' or \'export\''),
    ("inductor-post-grad", "passkit/pipelines/inductor-post-grad.toml: passkit fuzz compares programs it can call, and this "
                           "file mounts its steps in Inductor's slots; fuzz a pipeline that compiles or exports, such as "
                           "'training' or 'export'"),
])
def test_a_pipeline_fuzz_cannot_call_is_one_line_and_exit_2(cli, workdir: Path, pipeline: str, message: str) -> None:
    # It was 199 "differences" in 200 programs, each the compile's refusal.
    result = cli.invoke(main, ["fuzz", pipeline, "--programs", "3"])
    assert result.exit_code == 2
    assert result.stderr.strip() == message
    assert not (workdir / "passkit-fuzz").exists()


def test_without_hypothesis_it_says_how_to_install_it(cli, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hypothesis", None)
    result = cli.invoke(main, ["fuzz", "training-python", "--programs", "1"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "passkit fuzz needs hypothesis: pip install 'passkit[fuzz]' (or hypothesis)"
