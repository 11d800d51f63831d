"""The one rule for the folders passkit reads pickles from: created 0700, refused when the group
or others can write them or another user owns them, as ssh refuses a key file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from passkit.core import private_folders
from passkit.core.private_folders import UnsafeFolderError, private_folder, refusal


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_missing_folders_are_created_private_from_the_trusted_top_down(tmp_path: Path) -> None:
    made = private_folder(tmp_path / "top" / "mid" / "leaf", "test folder", trusted_from=tmp_path / "top")
    assert made == tmp_path / "top" / "mid" / "leaf"
    assert [_mode(tmp_path / sub) for sub in ("top", "top/mid", "top/mid/leaf")] == [0o700, 0o700, 0o700]


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o1777])
def test_a_folder_the_group_or_others_can_write_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(UnsafeFolderError) as raised:
        private_folder(folder, "test folder")
    assert str(raised.value) == (f"test folder {folder} is writable by others (mode {mode:04o}), so passkit does not "
                                 f"use it; run chmod 700 {folder}")


def test_a_refused_folder_between_the_trusted_top_and_the_leaf_stops_before_anything_is_made_in_it(tmp_path: Path) -> None:
    (tmp_path / "top" / "mid").mkdir(parents=True)
    (tmp_path / "top" / "mid").chmod(0o777)
    with pytest.raises(UnsafeFolderError, match=r"test folder .*/top/mid is writable by others \(mode 0777\)"):
        private_folder(tmp_path / "top" / "mid" / "leaf", "test folder", trusted_from=tmp_path / "top")


def test_a_folder_another_user_owns_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    owner = folder.stat().st_uid
    monkeypatch.setattr(private_folders, "_uid", lambda: owner + 1)  # we are someone else now
    assert refusal(folder, "test folder") == (f"test folder {folder} belongs to another user (uid {owner}), so passkit "
                                              f"does not use it; remove it or choose a folder of your own")
    with pytest.raises(UnsafeFolderError):
        private_folder(folder, "test folder")


def test_a_link_another_user_made_is_refused_even_to_a_private_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "mine"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(target)
    assert refusal(link, "test folder") is None  # the user's own link to the user's own folder
    real_lstat = Path.lstat
    monkeypatch.setattr(Path, "lstat", lambda self: os.stat_result((*real_lstat(self)[:4], 12345, *real_lstat(self)[5:]))
                        if self == link else real_lstat(self))
    assert refusal(link, "test folder").startswith(f"test folder {link} belongs to another user (uid 12345)")


def test_a_private_folder_and_a_missing_one_pass(tmp_path: Path) -> None:
    (tmp_path / "ok").mkdir(mode=0o700)
    assert refusal(tmp_path / "ok", "test folder") is None
    assert refusal(tmp_path / "missing", "test folder") is None
