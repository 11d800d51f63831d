"""Where reproducers go: never the user's working directory unless asked. By default a folder of
the process under the system temp directory, named in the error; ``PASSKIT_REPRO_DIR`` or
``[settings] repro_dir`` choose another."""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import passkit
import planted_bugs

REPO = Path(__file__).resolve().parents[2]
EXPLODING = '[pipeline]\nname = "exploding"\nextends = "training-python"\n\n[[steps]]\npass = "planted.explode"\nafter = "functionalize"\n'

SCRIPT = """
import sys, torch, passkit, planted_bugs
from passkit.core.plugins import get_plugin_manager

get_plugin_manager().register(planted_bugs, name="planted_bugs")
compiled = torch.compile(lambda x: x.sin() * 2, backend=passkit.backend(sys.argv[1]))
try:
    compiled(torch.randn(4, requires_grad=True))
except Exception as exc:
    print(str(exc))
"""


@pytest.mark.slow
def test_a_failing_torch_compile_leaves_the_working_directory_alone_and_names_the_reproducer(tmp_path: Path) -> None:
    work, temp, config = tmp_path / "work", tmp_path / "temp", tmp_path / "config"
    for folder in (work, temp, config):
        folder.mkdir()
    (config / "exploding.toml").write_text(EXPLODING)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PASSKIT_") or key == "PASSKIT_CACHE_DIR"}
    env.update(TMPDIR=str(temp), PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(config / "exploding.toml")], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert list(work.iterdir()) == []
    found = re.search(r"\(reproducer: (?P<folder>[^)]+)\)", done.stdout)
    assert found is not None, done.stdout
    folder = Path(found["folder"])
    assert folder.parent.parent == temp / f"passkit-{getpass.getuser()}" / "repro"
    assert re.fullmatch(r"run_\d{4}(_\d\d){5}-pid_\d+", folder.parent.name)
    assert folder.name == "02-planted.explode"
    assert json.loads((folder / "manifest.json").read_text())["failure"]["message"] == "RuntimeError: planted failure"


def _exploding(tmp_path: Path, **settings: str):  # noqa: ANN202
    path = tmp_path / "exploding.toml"
    path.write_text(EXPLODING)
    return passkit.aot_function(lambda x: x.sin() * 2, pipeline=str(path), **settings)


def _reproducer(compiled) -> str:  # noqa: ANN001
    with pytest.raises(passkit.PasskitError) as raised:
        compiled(torch.randn(4, requires_grad=True))
    found = re.search(r"\(reproducer: (?P<folder>[^)]+)\)$", str(raised.value))
    assert found is not None, str(raised.value)
    return found["folder"]


def test_passkit_repro_dir_chooses_the_folder(register_passkit_plugin, tmp_path: Path, monkeypatch) -> None:
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    monkeypatch.setenv("PASSKIT_REPRO_DIR", str(tmp_path / "from-env"))
    assert _reproducer(_exploding(tmp_path)) == str(tmp_path / "from-env" / "02-planted.explode")


def test_the_repro_dir_setting_wins_over_the_environment(register_passkit_plugin, tmp_path: Path, monkeypatch) -> None:
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    monkeypatch.setenv("PASSKIT_REPRO_DIR", str(tmp_path / "from-env"))
    folder = _reproducer(_exploding(tmp_path, repro_dir=str(tmp_path / "from-settings")))
    assert folder == str(tmp_path / "from-settings" / "02-planted.explode")
    assert not (tmp_path / "from-env").exists()


def test_an_empty_repro_dir_writes_none(register_passkit_plugin, tmp_path: Path, monkeypatch) -> None:
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    monkeypatch.setenv("PASSKIT_REPRO_DIR", str(tmp_path / "from-env"))
    with pytest.raises(passkit.PasskitError) as raised:
        _exploding(tmp_path, repro_dir="")(torch.randn(4, requires_grad=True))
    assert "reproducer" not in str(raised.value)
    assert not (tmp_path / "from-env").exists()
