"""The compile cache's folder is the user's own: passkit creates it with mode 0700, and a folder
that the group or others can write, or that another user owns, is refused in one warning line
naming the fix; the compile goes on without the cache, reading and writing nothing there."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import passkit
from passkit.cache import folder as cache_folder
from passkit.cache.folder import CACHE_ENV
from passkit.cli import main
from passkit.core import private_folders


def _compile() -> str:
    """Compile and run ``sin(2x)`` through ``training-python``; its report's cache mark."""
    compiled = passkit.aot_function(lambda x: (x * 2.0).sin(), pipeline="training-python")
    x = torch.randn(3, 4, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.cos(x * 2.0) * 2.0)
    return compiled.passkit_reports[0].cache


def _passkit_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name.startswith("passkit")]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "caches" / "passkit"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    monkeypatch.setattr(cache_folder, "_warned", set())
    return folder


def test_the_cache_folder_and_its_missing_parents_are_made_private(cache: Path) -> None:
    assert _compile() == "miss"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(cache.parent.stat().st_mode) == 0o700
    assert [stat.S_IMODE(entry.stat().st_mode) for entry in cache.iterdir()] == [0o600]
    assert _compile() == "hit"


def test_a_folder_others_can_write_is_neither_read_nor_written(cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert _compile() == "miss"
    (entry,) = cache.iterdir()
    cache.chmod(0o777)
    before = entry.read_bytes(), entry.stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="passkit.cache"):
        assert _compile() == ""  # the entry is there, and not loaded
        assert _compile() == ""
    assert _passkit_lines(caplog) == [  # one line per folder and process, naming the fix
        f"passkit: compile cache folder {cache} is writable by others (mode 0777), so passkit does not use it; "
        f"run chmod 700 {cache}"
    ]
    assert list(cache.iterdir()) == [entry]
    assert (entry.read_bytes(), entry.stat().st_mtime_ns) == before  # not even touched as a use


def test_a_group_writable_folder_is_refused_too(cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache.mkdir(parents=True, mode=0o700)
    cache.chmod(0o770)
    with caplog.at_level(logging.WARNING, logger="passkit.cache"):
        assert _compile() == ""
    assert _passkit_lines(caplog) == [f"passkit: compile cache folder {cache} is writable by others (mode 0770), so passkit "
                               f"does not use it; run chmod 700 {cache}"]
    assert list(cache.iterdir()) == []


def test_a_folder_another_user_owns_is_refused(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                               caplog: pytest.LogCaptureFixture) -> None:
    assert _compile() == "miss"
    owner = cache.stat().st_uid
    monkeypatch.setattr(private_folders, "_uid", lambda: owner + 1)
    with caplog.at_level(logging.WARNING, logger="passkit.cache"):
        assert _compile() == ""
    assert _passkit_lines(caplog) == [f"passkit: compile cache folder {cache} belongs to another user (uid {owner}), so "
                               f"passkit does not use it; remove it or choose a folder of your own"]


def test_cache_info_shows_the_refusal(cache: Path) -> None:
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    runner = CliRunner()
    data = json.loads(runner.invoke(main, ["cache", "info", "--json"]).stdout)
    reason = f"compile cache folder {cache} is writable by others (mode 0777), so passkit does not use it; run chmod 700 {cache}"
    assert data["refused"] == reason
    text = runner.invoke(main, ["cache", "info"]).stdout.splitlines()
    assert text[:2] == [f"directory: {cache}", f"refused: {reason}; compiles neither read nor write it"]
    os.chmod(cache, 0o700)
    assert "refused" not in runner.invoke(main, ["cache", "info"]).stdout
