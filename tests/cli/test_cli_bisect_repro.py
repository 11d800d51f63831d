"""``passkit bisect`` prints the first bad step and writes a minimal pipeline that still fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import planted_bugs
from passkit.cli import main

pytestmark = pytest.mark.slow

FIXED_TRAINING = str(Path(__file__).resolve().parents[1] / "debug" / "fixed_training.toml")
REPO = Path(__file__).resolve().parents[2]
PLANTED = f'[pipeline]\nname = "planted"\nextends = "{FIXED_TRAINING}"\n\n[[steps]]\npass = "planted.scale_add"\nafter = "joint"\n'


@pytest.fixture
def planted(register_passkit_plugin, workdir):
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    (workdir / "planted.toml").write_text(PLANTED)
    return workdir


def test_bisect_names_the_bad_step_and_its_minimal_pipeline_reproduces_it(cli, planted) -> None:
    result = cli.invoke(main, ["bisect", "planted.toml", "--model", "planted_bugs:tiny"])
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "first bad step: planted.toml: steps[0] (planted.scale_add)"
    assert lines[1].startswith("  graph 1, training: numerics: changed numerics: max |diff| ")
    assert lines[2:] == [
        "minimal pipeline: planted-minimal.toml (3 steps: functionalize, planted.scale_add, codegen.python), reproduces",
        "reproducer: passkit-repro/02-planted.scale_add",
    ]
    assert "bisect: graph 1, training: steps 1-8: numerics" in result.stderr.splitlines()
    assert (planted / "passkit-repro" / "02-planted.scale_add" / "manifest.json").is_file()
    rerun = cli.invoke(main, ["run", "planted-minimal.toml", "--model", "planted_bugs:tiny"])
    assert rerun.exit_code == 1  # results that differ (README), not bad input
    error = rerun.stderr.splitlines()[-1]  # after the progress lines
    assert error.startswith("planted-minimal.toml: steps[1] (planted.scale_add) changed numerics: max |diff| ")
    assert error.endswith(" (reproducer: passkit-repro/02-planted.scale_add-2)")
    replayed = cli.invoke(main, ["repro", "passkit-repro/02-planted.scale_add", "--json"])
    assert replayed.exit_code == 1
    assert json.loads(replayed.stdout)["reproduced"] is True


def test_bisect_json_and_exit_0_when_every_step_is_good(cli, planted) -> None:
    result = cli.invoke(main, ["bisect", "inference-python", "--model", "planted_bugs:tiny", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["first_bad_step"], data["minimal_pipeline"]) == (None, None)
    assert data["graphs"] == [{"graph": "graph 1, inference", "trials": [{"steps": [1, 2, 3, 4, 5], "outcome": "good", "message": ""}]}]


def test_bisect_bad_input_exits_2(cli, planted) -> None:
    result = cli.invoke(main, ["bisect", "nope.toml", "--model", "planted_bugs:tiny"])
    assert (result.exit_code, result.stderr) == (2, "passkit: pipeline file not found: nope.toml\n")
    result = cli.invoke(main, ["bisect", "planted.toml", "--model", "planted_bugs"])
    assert (result.exit_code, result.stderr) == (2, "--model must look like 'package.module:factory', not 'planted_bugs'\n")


def test_repro_bad_input_exits_2(cli, workdir) -> None:
    result = cli.invoke(main, ["repro", "nowhere"])
    assert (result.exit_code, result.stderr) == (2, "nowhere: not a passkit reproducer (no manifest.json)\n")


ADD_LINE = f"planted_bugs.py:{Path(planted_bugs.__file__).read_text().splitlines().index('        h = torch.relu(h) + x') + 1}"
PATTERNS = (
    f'[pipeline]\nname = "patterns"\nextends = "{FIXED_TRAINING}"\n\n'
    '[[steps]]\npass = "rewrite"\npatterns = ["noops", "planted"]\nafter = "functionalize"\n'
)


def test_bisect_goes_on_to_the_first_bad_pattern_application(cli, planted) -> None:
    (planted / "patterns.toml").write_text(PATTERNS)
    result = cli.invoke(main, ["bisect", "patterns.toml", "--model", "planted_bugs:chain"])
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "first bad step: patterns.toml: steps[0] (rewrite)"
    assert lines[2:] == [
        f"  first bad pattern application: planted:scale_add (application 3 of 6), graph main, nodes add ({ADD_LINE})",
        "minimal pipeline: patterns-minimal.toml (3 steps: functionalize, rewrite, codegen.python), reproduces",
        "reproducer: passkit-repro/02-rewrite",
    ]
    assert "bisect: graph 1, training: steps 1-2, applications 1-2 of step 2: good" in result.stderr.splitlines()
    assert 'only = [\n    "planted:scale_add",\n]' in (planted / "patterns-minimal.toml").read_text()
    as_json = cli.invoke(main, ["bisect", "patterns.toml", "--model", "planted_bugs:chain", "--json", "--out", "again.toml"])
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["first_bad_step"]["pattern_application"] == {
        "index": 3, "of": 6, "kind": "pattern", "name": "planted:scale_add", "group": "planted", "graph": "main",
        "nodes": ["add"], "source": ADD_LINE,
    }


def _passkit(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    env.pop("PASSKIT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "passkit", *args], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )


def test_bisect_from_a_reproducer_in_a_fresh_process_names_the_step(cli, planted) -> None:
    (planted / "verified.toml").write_text(
        f'[pipeline]\nname = "verified"\nextends = "{FIXED_TRAINING}"\n\n[settings]\nverify = "numerics"\n\n'
        '[[steps]]\npass = "planted.scale_add"\nafter = "partition.default"\n'
    )
    run = cli.invoke(main, ["run", "verified.toml", "--model", "planted_bugs:tiny"])
    assert run.exit_code == 1
    assert run.stderr.splitlines()[-1].endswith("(reproducer: passkit-repro/05-planted.scale_add)")
    result = _passkit(planted, "bisect", "--repro", "passkit-repro/05-planted.scale_add", "--plugin", "planted_bugs")
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "first bad step: passkit-repro/05-planted.scale_add/pipeline.toml: steps[4] (planted.scale_add)"
    assert lines[1].startswith("  reproducer 05-planted.scale_add, training: numerics: changed numerics: max |diff| ")
    # The steps that had already run come first in the minimal pipeline, so it loads on its own.
    assert lines[2:] == [
        "minimal pipeline: verified-minimal.toml (6 steps: functionalize, decompose, joint, partition.default, "
        "planted.scale_add, codegen.python), reproduces",
        "reproducer: passkit-repro/05-planted.scale_add-2",
    ]
    assert "bisect: reproducer 05-planted.scale_add, training: steps 5-8: numerics" in result.stderr.splitlines()


def test_bisect_from_a_bad_reproducer_folder_exits_2_in_one_line(cli, planted) -> None:
    result = cli.invoke(main, ["bisect", "--repro", "nowhere"])
    assert (result.exit_code, result.stderr) == (2, "nowhere: not a passkit reproducer (no such folder)\n")
    (planted / "empty").mkdir()
    result = cli.invoke(main, ["bisect", "--repro", "empty"])
    assert (result.exit_code, result.stderr) == (2, "empty: not a passkit reproducer (no manifest.json)\n")
    result = cli.invoke(main, ["bisect", "planted.toml", "--repro", "empty"])
    assert (result.exit_code, result.stderr) == (
        2, "--repro empty: give either a reproducer folder or FILE with --model, not both\n"
    )
    result = cli.invoke(main, ["bisect"])
    assert (result.exit_code, result.stderr) == (2, "passkit bisect: give a pipeline FILE (with --model) or --repro DIR\n")
