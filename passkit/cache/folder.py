"""Own the compile cache's folder: where it is, its size limit and least-recently-used eviction,
and what ``passkit cache info`` / ``passkit cache clear`` report and do.

An entry's modification time is its last use: writing an entry sets it, and a hit sets it again
(``touch``; access times are not used, since most file systems update them lazily or never).
After a write, while the entries together exceed the limit (``PASSKIT_CACHE_MAX_BYTES``,
default 2 GiB), the least recently used are deleted; the entry just written is kept, even when
it alone is larger than the limit. A reader racing an eviction finds no entry and compiles.
Counting the entries means a ``stat`` of each, so a write does not count them every time
(``after_write``): it adds its own bytes to the total this process last counted and counts again
only when that passes the limit, or when the count is ``RECOUNT_SECONDS`` old (other processes
write too). Counting on every write made filling the folder quadratic: the 1,440 programs of
one OpInfo entry spent more time in ``stat`` than in writing their entries.

Entries are pickles, and a hit imports the modules they name, so the folder must be the user's
own (``passkit.core.private_folders``): passkit creates it with mode 0700, and a folder that the
group or others can write, or that another user owns, is refused with one warning line naming
the fix; the compile then goes on without the cache, reading and writing nothing there.
``passkit cache info`` shows the refusal. A process that trusts signing keys
(``PASSKIT_CACHE_TRUSTED_KEYS``) loads only entries they signed, so it accepts a folder the group
can write or another user owns (a team's shared folder); its entries are then group-readable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from passkit.core.private_folders import UnsafeFolderError, private_folder, refusal

__all__ = [
    "CACHE_ENV",
    "MAX_BYTES_ENV",
    "DEFAULT_MAX_BYTES",
    "SUFFIX",
    "TEMP_SUFFIX",
    "cache_dir",
    "WHAT",
    "usable_cache_dir",
    "max_bytes",
    "touch",
    "evict",
    "after_write",
    "RECOUNT_SECONDS",
    "CacheInfo",
    "cache_info",
    "clear_cache",
]

CACHE_ENV = "PASSKIT_CACHE_DIR"
MAX_BYTES_ENV = "PASSKIT_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 * 1024**3

log = logging.getLogger("passkit.cache")
SUFFIX = ".entry"
TEMP_SUFFIX = ".tmp"
WHAT = "compile cache folder"  # how refusals name the folder

_warned: set[str] = set()  # the refused folders this process already warned about


def cache_dir() -> Path:
    """``PASSKIT_CACHE_DIR``, else ``<user cache dir>/passkit`` (XDG, macOS or Windows rules)."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    if configured:
        return Path(configured).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "passkit"


def usable_cache_dir(*, shared: bool = False) -> Path | None:
    """``cache_dir()``, created with mode 0700 if missing; None when it is refused (the group or
    others can write it, another user owns it; ``shared``, when the process trusts signing keys:
    only when others than the group can write it), with one warning line per folder and process."""
    folder = cache_dir()
    try:
        return private_folder(folder, WHAT, shared=shared)
    except UnsafeFolderError as exc:
        if str(folder) not in _warned:
            _warned.add(str(folder))
            log.warning("passkit: %s", exc)
        return None
    except OSError:  # cannot create it (a read-only file system): writing an entry says so
        return folder


def max_bytes() -> int:
    """The size limit: ``PASSKIT_CACHE_MAX_BYTES`` (``2GiB``, ``500MB``, ``1000000``), else 2 GiB.

    Raises ``ValueError`` with a one-line message for a value that is not a positive size."""
    from pydantic import ByteSize, TypeAdapter, ValidationError

    configured = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not configured:
        return DEFAULT_MAX_BYTES
    try:
        limit = int(TypeAdapter(ByteSize).validate_python(configured))
    except ValidationError:
        limit = 0
    if limit <= 0:
        raise ValueError(f"{MAX_BYTES_ENV}: expected a positive size such as 2GiB, 500MB or 1000000, got {configured!r}")
    return limit


def touch(path: Path) -> None:
    """Mark the entry at ``path`` as used now (a hit), so eviction keeps it longest."""
    with contextlib.suppress(OSError):
        os.utime(path)


def _entries(folder: Path) -> list[tuple[float, int, Path]]:
    """Every entry as (last use, size, path), least recently used first."""
    found = []
    for path in folder.glob(f"*{SUFFIX}") if folder.is_dir() else []:
        with contextlib.suppress(OSError):  # deleted meanwhile by another process
            stat = path.stat()
            found.append((stat.st_mtime, stat.st_size, path))
    return sorted(found, key=lambda item: (item[0], item[2].name))


def _limit() -> int:
    """``max_bytes()``, or 2 GiB with one warning when that is malformed."""
    try:
        return max_bytes()
    except ValueError as exc:
        log.warning("passkit: %s; using the default, 2 GiB", exc)
        return DEFAULT_MAX_BYTES


def evict(folder: Path, keep: Path | None = None, limit: int | None = None) -> list[Path]:
    """Delete the least recently used entries until the rest fit in ``limit`` (default
    ``max_bytes()``, or 2 GiB with one warning when that is malformed), never ``keep``; return
    the deleted paths."""
    if limit is None:
        limit = _limit()
    entries = _entries(folder)
    total = sum(size for _, size, _ in entries)
    removed = []
    for _, size, path in entries:
        if total <= limit:
            break
        if keep is not None and path == keep:
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
        total -= size
    _counted[str(folder)] = (total, time.monotonic())
    return removed


RECOUNT_SECONDS = 10.0
"""How old this process's count of a folder may get before a write counts the entries again."""
STALE_TEMP_SECONDS = 3600.0  # a temp file this old belongs to a writer that died

# folder -> (its entries' bytes as last counted plus what this process wrote since, when counted)
_counted: dict[str, tuple[int, float]] = {}


def after_write(folder: Path, written: Path, size: int) -> list[Path]:
    """After writing ``size`` bytes to ``written``: evict (``evict``, keeping ``written``) and
    remove dead writers' temporary files when the folder may be over the limit or this process's
    count of it is stale; return the deleted entries. The limit is read on every write, so a
    malformed one warns each time."""
    limit = _limit()
    total, counted_at = _counted.get(str(folder), (None, 0.0))
    if total is not None and total + size <= limit and time.monotonic() - counted_at < RECOUNT_SECONDS:
        # An overwritten entry is counted twice: too high a total only brings the recount forward.
        _counted[str(folder)] = (total + size, counted_at)
        return []
    remove_stale_temps(folder, STALE_TEMP_SECONDS)
    return evict(folder, keep=written, limit=limit)


@dataclass
class CacheInfo:
    """What the cache folder holds."""

    directory: str
    entries: int
    bytes: int
    max_bytes: int
    oldest_used: str | None  # ISO 8601 UTC time of the least recently used entry's last use
    newest_used: str | None
    incomplete: int  # temporary files of writers that have not finished (or died)
    refused: str | None = None  # why compiles neither read nor write the folder (not private)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _iso(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, tz=timezone.utc).isoformat(timespec="seconds")


def cache_info(directory: Path | None = None, *, shared: bool = False) -> CacheInfo:
    """Count the entries and their size under ``directory`` (default ``cache_dir()``)."""
    folder = directory or cache_dir()
    entries = _entries(folder)
    temps = list(folder.glob(f"*{TEMP_SUFFIX}")) if folder.is_dir() else []
    return CacheInfo(
        directory=str(folder), entries=len(entries), bytes=sum(size for _, size, _ in entries), max_bytes=max_bytes(),
        oldest_used=_iso(entries[0][0]) if entries else None, newest_used=_iso(entries[-1][0]) if entries else None,
        incomplete=len(temps), refused=refusal(folder, WHAT, shared=shared),
    )


def clear_cache(directory: Path | None = None) -> int:
    """Delete every entry and temporary file; return how many files were removed."""
    folder = directory or cache_dir()
    if not folder.is_dir():
        return 0
    removed = 0
    for path in [*folder.glob(f"*{SUFFIX}"), *folder.glob(f"*{TEMP_SUFFIX}"), *folder.glob("*.lock"), *folder.glob("*.gaveup")]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


def remove_stale_temps(directory: Path, older_than: float) -> None:
    """Delete temporary files older than ``older_than`` seconds (their writer died)."""
    now = time.time()
    for temp in directory.glob(f"*{TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            if now - temp.stat().st_mtime > older_than:
                temp.unlink()
