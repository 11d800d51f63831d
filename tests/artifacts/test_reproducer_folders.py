"""Reproducers are pickles that ``passkit repro`` loads, so their folders are the user's own: made
with mode 0700, and a root that the group or others can write, or that another user owns (on a
shared machine, someone may make ``<tmp>/passkit-<user>`` first), is refused in one warning line;
the reproducers go to a fresh private folder, which the error names. ``passkit repro`` refuses
to load a reproducer that others could have changed."""

from __future__ import annotations

import getpass
import logging
import re
import stat
import tempfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import passkit
import planted_bugs
from passkit.artifacts import reproducer
from passkit.cli import main
from passkit.core import private_folders

EXPLODING = '[pipeline]\nname = "exploding"\nextends = "training-python"\n\n[[steps]]\npass = "planted.explode"\nafter = "functionalize"\n'


@pytest.fixture
def temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, register_passkit_plugin) -> Path:
    """The system temp directory, here; reproducers at their default place under it."""
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    folder = tmp_path / "temp"
    folder.mkdir()
    folder.chmod(0o1777)  # as /tmp is
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.delenv("PASSKIT_REPRO_DIR")
    for cached in (reproducer._process_folder, reproducer._fresh_folder):
        cached.cache_clear()
    yield folder
    for cached in (reproducer._process_folder, reproducer._fresh_folder):
        cached.cache_clear()


def _reproducer(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> tuple[Path, list[str]]:
    """Run a pipeline whose second step raises; the reproducer it names and passkit's log lines."""
    path = tmp_path / "exploding.toml"
    path.write_text(EXPLODING)
    compiled = passkit.aot_function(lambda x: x.sin() * 2, pipeline=str(path))
    with caplog.at_level(logging.WARNING, logger="passkit"), pytest.raises(passkit.PasskitError) as raised:
        compiled(torch.randn(4, requires_grad=True))
    found = re.search(r"\(reproducer: (?P<folder>[^)]+)\)$", str(raised.value))
    assert found is not None, str(raised.value)
    return Path(found["folder"]), [r.getMessage() for r in caplog.records if r.name == "passkit"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_folder_of_the_default_root_is_made_private(temp: Path, tmp_path: Path, caplog) -> None:
    folder, lines = _reproducer(tmp_path, caplog)
    user = temp / f"passkit-{getpass.getuser()}"
    assert folder.parent.parent == user / "repro" and lines == []
    for made in (user, user / "repro", folder.parent, folder, folder / "graphs"):
        assert _mode(made) == 0o700, made


def test_a_root_another_user_made_world_writable_first_is_refused(temp: Path, tmp_path: Path, caplog) -> None:
    planted = temp / f"passkit-{getpass.getuser()}"
    planted.mkdir()
    planted.chmod(0o777)
    folder, lines = _reproducer(tmp_path, caplog)
    fresh = folder.parent
    assert re.fullmatch(r"passkit-repro-\w+", fresh.name) and fresh.parent == temp
    assert folder.name == "02-planted.explode" and _mode(fresh) == 0o700
    assert lines == [f"passkit: reproducer folder {planted} is writable by others (mode 0777), so passkit does not "
                     f"use it; run chmod 700 {planted}; this run's reproducers go to {fresh}"]
    assert list(planted.iterdir()) == []


def test_a_root_another_user_owns_is_refused(temp: Path, tmp_path: Path, caplog, monkeypatch) -> None:
    planted = temp / f"passkit-{getpass.getuser()}"
    planted.mkdir(mode=0o700)
    owner = planted.stat().st_uid
    monkeypatch.setattr(private_folders, "_uid", lambda: owner + 1)
    folder, lines = _reproducer(tmp_path, caplog)
    assert lines == [f"passkit: reproducer folder {planted} belongs to another user (uid {owner}), so passkit does "
                     f"not use it; remove it or choose a folder of your own; this run's reproducers go to {folder.parent}"]
    assert folder.parent.parent == temp and list(planted.iterdir()) == []


def test_a_group_writable_repro_dir_is_refused(temp: Path, tmp_path: Path, caplog, monkeypatch) -> None:
    chosen = tmp_path / "team-repros"
    chosen.mkdir()
    chosen.chmod(0o775)
    monkeypatch.setenv("PASSKIT_REPRO_DIR", str(chosen))
    folder, lines = _reproducer(tmp_path, caplog)
    assert lines == [f"passkit: reproducer folder {chosen} is writable by others (mode 0775), so passkit does not "
                     f"use it; run chmod 700 {chosen}; this run's reproducers go to {folder.parent}"]
    assert folder.parent.parent == temp and list(chosen.iterdir()) == []


def test_passkit_repro_refuses_a_reproducer_others_could_change(temp: Path, tmp_path: Path, caplog) -> None:
    folder, _ = _reproducer(tmp_path, caplog)
    runner = CliRunner()
    replayed = runner.invoke(main, ["repro", str(folder), "--plugin", "planted_bugs"])
    assert replayed.exit_code == 4, replayed.output  # private: it replays (and fails again)
    (folder / "program.pkl").chmod(0o666)
    refused = runner.invoke(main, ["repro", str(folder), "--plugin", "planted_bugs"])
    assert (refused.exit_code, refused.stderr) == (2, (
        f"reproducer file {folder / 'program.pkl'} is writable by others (mode 0666), so passkit does not use it; "
        f"run chmod 700 {folder / 'program.pkl'}\n"))
    (folder / "program.pkl").chmod(0o600)
    folder.chmod(0o777)
    refused = runner.invoke(main, ["repro", str(folder), "--plugin", "planted_bugs"])
    assert (refused.exit_code, refused.stderr) == (2, (
        f"reproducer folder {folder} is writable by others (mode 0777), so passkit does not use it; "
        f"run chmod 700 {folder}\n"))
