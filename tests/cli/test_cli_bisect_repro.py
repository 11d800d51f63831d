"""``passkit bisect`` prints the first bad step and writes a minimal pipeline that still fails."""

from __future__ import annotations

from pathlib import Path

import json

import pytest

import planted_bugs
from passkit.cli import main

pytestmark = pytest.mark.slow

FIXED_TRAINING = str(Path(__file__).resolve().parents[1] / "debug" / "fixed_training.toml")
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
    assert rerun.exit_code == 2
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
