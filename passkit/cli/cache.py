"""Own ``passkit cache``: what the compile cache holds (``info``: the folder, and the server with
``PASSKIT_CACHE_URL``), emptying the folder (``clear``), making a signing key pair (``keygen``),
and moving a folder's entries as one file (``pack``, ``unpack``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from passkit.cli import terminal

__all__ = ["command"]


@click.group("cache")
def command() -> None:
    """Inspect, empty, sign or ship the compile cache (PASSKIT_CACHE_DIR, else the user cache
    directory; PASSKIT_CACHE_URL adds a Redis server behind it)."""


def _keys() -> tuple[frozenset[bytes], str | None]:
    """The trusted keys and this process's signing key's public half, as ``info`` shows them."""
    from passkit.cache.signing import public_half, public_text, signing_key, trusted_keys

    signer = signing_key()
    return trusted_keys(), public_text(public_half(signer)) if signer is not None else None


@command.command("info")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def info(as_json: bool) -> None:
    """Show the cache folder, its entries and their size, the size limit and the entries' last
    use; the keys this process signs with and trusts; and the server: reachable, its entries and
    their size, and whether compiles read it."""
    from passkit.cache.folder import MAX_BYTES_ENV, cache_info
    from passkit.cache.server import server_info, server_url
    from passkit.cache.signing import public_text
    from passkit.cache.store import server_unreadable, server_unwritable
    from passkit.core.report import format_bytes
    from passkit.errors import PasskitError

    trusted, signer = _keys()
    try:
        found = cache_info(shared=bool(trusted))
    except ValueError as exc:  # a malformed PASSKIT_CACHE_MAX_BYTES
        raise PasskitError(str(exc)) from None
    url = server_url()
    why = server_unreadable(trusted or None)
    server = server_info(url, readable=not why, unreadable=why, unwritable=server_unwritable(signer is not None)) if url else None
    if as_json:
        data: dict[str, Any] = found.to_json()
        data["signing_key"] = signer
        data["trusted_keys"] = sorted(public_text(raw) for raw in trusted)
        data["server"] = server.to_json() if server else None
        terminal.write_json(data)
        return
    terminal.out(f"directory: {found.directory}")
    if found.refused:
        terminal.out(f"refused: {found.refused}; compiles neither read nor write it")
    terminal.out(f"entries: {found.entries} ({format_bytes(found.bytes)})")
    terminal.out(f"size limit: {format_bytes(found.max_bytes)} ({MAX_BYTES_ENV}; least recently used entries are evicted past it)")
    if found.oldest_used and found.newest_used:
        terminal.out(f"last used: oldest {found.oldest_used}, newest {found.newest_used}")
    if found.incomplete:
        terminal.out(f"incomplete writes: {found.incomplete} (left by interrupted compiles; 'passkit cache clear' removes them)")
    if signer:
        terminal.out(f"signing key: {signer}")
    for key in sorted(public_text(raw) for raw in trusted):
        terminal.out(f"trusted key: {key}")
    if server is None:
        return
    if not server.reachable:
        terminal.out(f"server: {server.url}, unreachable ({server.error}); compiles use the folder alone")
        return
    terminal.out(f"server: {server.url}, reachable, {server.entries} entries ({format_bytes(server.bytes or 0)})")
    if server.why_not_read:
        terminal.out(f"server read: no: {server.why_not_read}")
    if server.why_not_written:
        terminal.out(f"server written: no: {server.why_not_written}")


@command.command("clear")
def clear() -> None:
    """Delete every entry of the compile cache folder (the server's entries stay)."""
    from passkit.cache.store import cache_dir, clear_cache

    removed = clear_cache()
    terminal.out(f"removed {removed} file{'s' if removed != 1 else ''} from {cache_dir()}")


@command.command("keygen")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def keygen(directory: Path) -> None:
    """Write an ed25519 key pair into DIRECTORY: passkit-cache.key (private, mode 0600; name it
    in PASSKIT_CACHE_SIGNING_KEY) and passkit-cache.pub (name it in PASSKIT_CACHE_TRUSTED_KEYS)."""
    from passkit.cache.signing import keygen as make_keys

    private, public = make_keys(directory)
    terminal.out(f"private key: {private} (PASSKIT_CACHE_SIGNING_KEY; keep it secret)")
    terminal.out(f"public key: {public} (PASSKIT_CACHE_TRUSTED_KEYS): {public.read_text().strip()}")


@command.command("pack")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print what was packed as JSON.")
def pack(out: Path, as_json: bool) -> None:
    """Write every entry of the cache folder, with its signature, into the file OUT."""
    from passkit.cache.pack import pack as pack_entries
    from passkit.core.report import format_bytes

    packed = pack_entries(out)
    if as_json:
        terminal.write_json(packed.to_json())
        return
    unsigned = f"; {packed.unsigned} unsigned (an unpack skips them)" if packed.unsigned else ""
    terminal.out(f"packed {packed.entries} entr{'y' if packed.entries == 1 else 'ies'} ({format_bytes(packed.bytes)}) into {out}{unsigned}")


@command.command("unpack")
@click.argument("archive", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print what was unpacked and skipped as JSON.")
def unpack(archive: Path, as_json: bool) -> None:
    """Check every entry of ARCHIVE against PASSKIT_CACHE_TRUSTED_KEYS, as a load does, and put
    those a trusted key signed into the cache folder; one line for each one skipped."""
    from passkit.cache.pack import unpack as unpack_entries

    unpacked = unpack_entries(archive)
    if as_json:
        terminal.write_json(unpacked.to_json())
        return
    for line in unpacked.skipped:
        terminal.out(f"skipped {line}")
    terminal.out(f"unpacked {unpacked.entries} entr{'y' if unpacked.entries == 1 else 'ies'} into {unpacked.directory}")
