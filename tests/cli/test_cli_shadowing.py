"""The installed ``passkit`` runs from a folder that holds a ``passkit/`` folder (a checkout of the
repository, an empty folder): with the working directory on ``sys.path`` (``python -m passkit``,
``PYTHONPATH=.``) such a folder is a namespace package that would stand in for the installed
package, so plugins failed on ``passkit.hookimpl`` and names resolved to its subfolders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = {
    "console script": [str(Path(sys.executable).parent / "passkit")],
    "python -m passkit": [sys.executable, "-m", "passkit"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("layout", ["empty", "checkout"])
def test_passkit_runs_from_a_folder_holding_a_passkit_folder(tmp_path: Path, command: str, layout: str) -> None:
    (tmp_path / "passkit").mkdir()
    if layout == "checkout":  # the repository's top folder: no __init__.py, a plugins/ folder
        (tmp_path / "passkit" / "plugins").mkdir()
        (tmp_path / "passkit" / "README.md").write_text("# passkit\n")
    env = {**os.environ, "PYTHONPATH": "."}
    done = subprocess.run([*COMMANDS[command], "passes"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr) == (0, "")
    assert "functionalize" in done.stdout and "failed to import" not in done.stdout
    checked = subprocess.run([*COMMANDS[command], "validate", "training-python"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "ok  training-python (11 steps)\n", "")
