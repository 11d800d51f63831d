"""Own ``passkit cache pack`` and ``unpack``: a folder's entries moved as one file, signatures
included, to bake a warm cache into a container image or copy it to another machine.

The file is a tar archive of ``<key>.entry`` members, each an entry's bytes as the folder holds
them (``passkit.cache.entry``). Unpacking reads the members itself (never ``extractall``): a
member whose name is not ``<64 hex digits>.entry``, or that is not a plain file, is skipped,
and every entry is checked as a load checks it, against the trusted keys, before it is written.
So unpacking needs ``PASSKIT_CACHE_TRUSTED_KEYS``: an unpacked entry is loaded later without
another look at where it came from, except its label, ``pack``, which reports show.
"""

from __future__ import annotations

import io
import re
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from passkit.cache.entry import CorruptEntry, UntrustedEntry, decode, with_origin
from passkit.cache.folder import SUFFIX, WHAT, cache_dir
from passkit.cache.signing import TRUSTED_KEYS_ENV, trusted_keys
from passkit.cache.stores import FolderStore
from passkit.core.private_folders import UnsafeFolderError, private_folder
from passkit.errors import PasskitError

__all__ = ["Packed", "Unpacked", "pack", "unpack"]

_MEMBER = re.compile(rf"[0-9a-f]{{64}}{re.escape(SUFFIX)}")


@dataclass
class Packed:
    file: str
    entries: int
    bytes: int
    unsigned: int  # entries no key signed: an unpack with trusted keys skips them

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Unpacked:
    directory: str
    entries: int  # written into the folder
    skipped: list[str] = field(default_factory=list)  # one line each: the member and why

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def pack(out: Path, directory: Path | None = None) -> Packed:
    """Write every entry of ``directory`` (default ``cache_dir()``) into the archive ``out``."""
    folder = directory or cache_dir()
    paths = sorted(folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []
    entries = size = unsigned = 0
    with tarfile.open(out, "w") as archive:
        for path in paths:
            try:
                blob = path.read_bytes()
            except FileNotFoundError:  # evicted meanwhile
                continue
            try:
                unsigned += not decode(blob, path.stem, None).signer
            except CorruptEntry:
                continue  # a damaged entry is not worth shipping
            info = tarfile.TarInfo(path.name)
            info.size, info.mode = len(blob), 0o600
            archive.addfile(info, io.BytesIO(blob))
            entries, size = entries + 1, size + len(blob)
    return Packed(str(out), entries, size, unsigned)


def unpack(archive_path: Path, directory: Path | None = None) -> Unpacked:
    """Check every entry of the archive against the trusted keys and write those that pass into
    ``directory`` (default ``cache_dir()``), labelled ``pack``."""
    trusted = trusted_keys()
    if not trusted:
        raise PasskitError(f"passkit cache unpack writes only entries a trusted key signed; set {TRUSTED_KEYS_ENV}=FILE[:FILE...]")
    folder = directory or cache_dir()
    try:
        store = FolderStore(private_folder(folder, WHAT, shared=True), shared=True)
    except UnsafeFolderError as exc:
        raise PasskitError(str(exc)) from None
    result = Unpacked(str(folder), 0)
    try:
        archive = tarfile.open(archive_path, "r")
    except (OSError, tarfile.TarError) as exc:
        raise PasskitError(f"cannot read {archive_path} as a passkit cache pack ({exc})") from None
    with archive:
        for member in archive:
            if not member.isfile() or not _MEMBER.fullmatch(member.name):
                result.skipped.append(f"{member.name}: not a cache entry")
                continue
            key = member.name[: -len(SUFFIX)]
            handle = archive.extractfile(member)
            blob = handle.read() if handle is not None else b""
            try:
                decode(blob, key, trusted)
            except (CorruptEntry, UntrustedEntry) as exc:
                result.skipped.append(f"{member.name}: {exc}")
                continue
            store.put(key, with_origin(blob, "pack"))
            result.entries += 1
    return result
