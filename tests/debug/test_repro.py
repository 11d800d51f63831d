"""A failing step writes a reproducer that ``passkit repro`` replays without the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import passkit
import planted_bugs
from passkit.debug.replay import replay
from passkit.core.plugins import get_plugin_manager
from passkit.core.registry import get_registry

FIXED_TRAINING = str(Path(__file__).resolve().parent / "fixed_training.toml")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli():
    from click.testing import CliRunner

    return CliRunner()


@pytest.fixture
def planted(register_passkit_plugin, tmp_path, monkeypatch):
    """The planted passes registered, and a scratch folder as the working directory."""
    monkeypatch.chdir(tmp_path)
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    return tmp_path


def _pipeline(folder: Path, step: str, *, after: str, verify: str = "numerics", base: str = FIXED_TRAINING) -> str:
    (folder / "planted.toml").write_text(
        f'[pipeline]\nname = "planted"\nextends = "{base}"\n\n[settings]\nverify = "{verify}"\n\n'
        f'[[steps]]\npass = "{step}"\nafter = "{after}"\n'
    )
    return "planted.toml"


def _fail(pipeline: str, error: type[Exception]) -> str:
    compiled = passkit.aot_function(lambda x, w: (x @ w + x).sin().sum(), pipeline=pipeline)
    with pytest.raises(error) as info:
        compiled(torch.randn(3, 4), torch.randn(4, 4, requires_grad=True))
    return str(info.value)


def test_a_numerics_change_writes_a_reproducer_named_in_the_error(planted) -> None:
    message = _fail(_pipeline(planted, "planted.scale_add", after="joint"), passkit.VerificationError)
    assert message.startswith("planted.toml: steps[0] (planted.scale_add) changed numerics: max |diff| ")
    assert message.endswith(" of graph joint (rtol 0.0001, atol 1e-05) (reproducer: passkit-repro/04-planted.scale_add)")
    folder = planted / "passkit-repro" / "04-planted.scale_add"
    assert sorted(p.name for p in folder.iterdir()) == [
        "graphs", "inputs.pt", "manifest.json", "pipeline.toml", "program.json", "program.pkl",
    ]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["step"] | {"fingerprint": ""} == {
        "number": 4, "position": 3, "id": "planted.scale_add", "pass": "planted.scale_add", "fingerprint": "",
        "label": "planted.toml: steps[0] (planted.scale_add)", "module": "planted_bugs", "distribution": "",
    }
    assert manifest["step"]["fingerprint"] == planted_bugs.scale_add.fingerprint()
    assert manifest["failure"] == {"kind": "numerics", "message": message.split(" (reproducer:")[0]}
    assert manifest["previous"] == ["functionalize", "decompose", "joint"]
    # Rebuilt by running those steps again on the first snapshot: the same graphs as the failing run.
    assert manifest["same_graphs_as_the_failing_run"] is True
    assert manifest["versions"]["torch"] == torch.version.__version__
    assert sorted(manifest["versions"]) == ["passkit", "plugins", "python", "torch"]  # plugins: installed entry points
    # The program as it was before the failing step: the joint graph, as code.
    assert [p.name for p in (folder / "graphs").iterdir()] == ["joint.py"]
    assert "torch.ops.aten.add.Tensor" in (folder / "graphs" / "joint.py").read_text()
    summary = json.loads((folder / "program.json").read_text())
    assert summary["facts"] == ["captured", "decomposed", "functional", "joint"]
    assert [i["value"] for i in summary["inputs"]] == ["float32[3, 4] on cpu", "float32[4, 4] on cpu, requires_grad"]
    assert summary["graphs"]["joint"]["inputs"] == ["user[0]", "user[1]", "tangent[0]"]
    # The resolved pipeline reads back on its own: no extends, the failing step at its position.
    resolved = passkit.load_pipeline(str(folder / "pipeline.toml"))
    assert [s.id for s in resolved.steps][3] == "planted.scale_add"
    assert resolved.settings.verify == "numerics"


def test_reproducers_never_overwrite_each_other(planted) -> None:
    pipeline = _pipeline(planted, "planted.scale_add", after="joint")
    first = _fail(pipeline, passkit.VerificationError)
    second = _fail(pipeline, passkit.VerificationError)
    assert first.endswith("(reproducer: passkit-repro/04-planted.scale_add)")
    assert second.endswith("(reproducer: passkit-repro/04-planted.scale_add-2)")


def test_a_crash_writes_a_reproducer_and_an_empty_repro_dir_turns_them_off(planted) -> None:
    pipeline = _pipeline(planted, "planted.explode", after="partition.default", verify="off")
    message = _fail(pipeline, passkit.PassError)
    assert message == (
        "planted.toml: steps[0] (planted.explode) failed: RuntimeError: planted failure "
        "(after: functionalize, decompose, joint, partition.default) (reproducer: passkit-repro/05-planted.explode)"
    )
    manifest = json.loads((planted / "passkit-repro" / "05-planted.explode" / "manifest.json").read_text())
    assert manifest["failure"] == {"kind": "crash", "message": "RuntimeError: planted failure"}
    assert manifest["input_values"] is None  # values are known only under verify = "numerics"
    compiled = passkit.aot_function(lambda x: x.sin(), pipeline=pipeline, repro_dir="")
    with pytest.raises(passkit.PassError) as info:
        compiled(torch.randn(2, requires_grad=True))
    assert str(info.value) == (
        "planted.toml: steps[0] (planted.explode) failed: RuntimeError: planted failure "
        "(after: functionalize, decompose, joint, partition.default)"
    )
    assert [p.name for p in (planted / "passkit-repro").iterdir()] == ["05-planted.explode"]


def test_replay_reproduces_in_process_for_both_planted_bugs(planted) -> None:
    _fail(_pipeline(planted, "planted.scale_add", after="joint"), passkit.VerificationError)
    result = replay(planted / "passkit-repro" / "04-planted.scale_add", pm=get_plugin_manager(), registry=get_registry())
    assert (result.reproduced, result.kind, result.version_notes) == (True, "numerics", [])
    assert result.message.startswith(
        "passkit-repro/04-planted.scale_add/pipeline.toml: steps[3] (planted.scale_add) changed numerics: max |diff| "
    )
    _fail(_pipeline(planted, "planted.explode", after="decompose", verify="off"), passkit.PassError)
    result = replay(planted / "passkit-repro" / "03-planted.explode", pm=get_plugin_manager(), registry=get_registry())
    assert (result.reproduced, result.kind) == (True, "crash")


def _passkit(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    env.pop("PASSKIT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "passkit", *args], cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_passkit_repro_replays_in_a_fresh_process_without_the_model(planted) -> None:
    _fail(_pipeline(planted, "planted.scale_add", after="joint"), passkit.VerificationError)
    folder = "passkit-repro/04-planted.scale_add"
    again = _passkit(planted, "repro", folder, "--plugin", "planted_bugs")
    assert again.returncode == 1, again.stderr
    assert again.stdout.startswith(f"reproduced (numerics): {folder}/pipeline.toml: steps[3] (planted.scale_add) changed numerics: ")
    fixed = _passkit(planted, "repro", folder, "--plugin", "planted_bugs_fixed")
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.startswith(f"did not reproduce: {folder}/pipeline.toml: steps[3] (planted.scale_add) ran cleanly")
    assert "passkit repro: pass planted.scale_add is planted.scale_add@1:" in fixed.stderr


def test_replaying_without_the_pass_installed_is_a_one_line_error(planted, cli) -> None:
    from passkit.cli import main

    _fail(_pipeline(planted, "planted.scale_add", after="joint"), passkit.VerificationError)
    get_plugin_manager().unregister(name="planted_bugs")
    try:
        result = cli.invoke(main, ["repro", "passkit-repro/04-planted.scale_add"])
    finally:
        get_plugin_manager().register(planted_bugs, name="planted_bugs")
    # The manifest records the pass's module: the error names it and the option that registers it.
    assert (result.exit_code, result.stderr) == (
        2, "passkit-repro/04-planted.scale_add: the failing step's pass 'planted.scale_add' is not registered; "
        "the reproducer recorded it from module 'planted_bugs': install its plugin, or name the module with "
        "--plugin planted_bugs\n"
    )
