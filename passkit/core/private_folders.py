"""Own the one rule for the folders passkit reads pickles from: they are private to the user.

The compile cache loads pickled graphs and imports the modules an entry names; ``passkit repro``
loads a reproducer's pickled program. Whoever can write such a folder can make passkit run their
code, so, as ssh refuses a key file others can read, passkit refuses a folder that:

- the group or others can write (mode ``g+w`` or ``o+w``), or
- belongs to another user (a folder another user created first, such as
  ``<tmp>/passkit-<user>`` on a shared machine).

``private_folder`` creates missing folders with mode 0700 and checks every folder from the first
one it is told to trust down to the one it returns; ``refusal`` says why one folder is refused.
The refusal is one line naming the folder and the fix. A folder whose files prove who made them
(the compile cache when the process trusts signing keys) may be ``shared``: the group may write
it and another user may own it, but not everyone may write it. Only the folders passkit writes in are
checked, not their parents: ``/tmp`` itself is world-writable (its sticky bit keeps others from
renaming what they do not own). On systems without POSIX owners (Windows) nothing is refused.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from passkit.errors import PasskitError

__all__ = ["MODE", "UnsafeFolderError", "refusal", "private_folder"]

MODE = 0o700


class UnsafeFolderError(PasskitError):
    """A folder passkit would read or write its pickles in is not private to the user."""


def _uid() -> int | None:
    getuid = getattr(os, "getuid", None)
    return getuid() if getuid is not None else None


def refusal(folder: Path, what: str, *, shared: bool = False) -> str | None:
    """The one-line reason passkit does not use ``folder`` (``what`` names its role, as in
    "compile cache folder"), or None when it is private to this user (``shared``: when others
    than the group cannot write it) or does not exist."""
    uid = _uid()
    if uid is None:
        return None
    try:
        found = [folder.lstat()]
        if stat.S_ISLNK(found[0].st_mode):
            # A link counts as the user's only if they made it: whoever owns a link can repoint it.
            found.append(folder.stat())
    except FileNotFoundError:
        return None
    owners = [entry.st_uid for entry in found if entry.st_uid != uid]
    if owners and not shared:
        return (f"{what} {folder} belongs to another user (uid {owners[0]}), so passkit does not use it; "
                f"remove it or choose a folder of your own")
    mode = found[-1].st_mode
    if mode & (stat.S_IWOTH if shared else stat.S_IWGRP | stat.S_IWOTH):
        return (f"{what} {folder} is writable by others (mode {stat.S_IMODE(mode):04o}), so passkit "
                f"does not use it; run chmod 700 {folder}")
    return None


def private_folder(folder: Path, what: str, *, trusted_from: Path | None = None, shared: bool = False) -> Path:
    """Create ``folder`` (and missing parents) with mode 0700 and return it; raise
    ``UnsafeFolderError`` when it, or a folder between ``trusted_from`` (default: ``folder``
    itself) and it, is refused (``refusal``). Nothing is made inside a refused folder."""
    folder = Path(folder)
    top = Path(trusted_from) if trusted_from is not None else folder
    for level in reversed([folder, *folder.parents]):  # from the root down
        if not level.exists():
            try:
                level.mkdir(mode=MODE)
            except FileExistsError:  # made meanwhile, by another process (or user: checked below)
                pass
        if level == top or top in level.parents:
            reason = refusal(level, what, shared=shared)
            if reason is not None:
                raise UnsafeFolderError(reason)
    return folder
