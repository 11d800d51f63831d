"""Own ``passkit cache``: what the on-disk compile cache holds (``info``) and emptying it (``clear``)."""

from __future__ import annotations

import click

from passkit.cli import terminal

__all__ = ["command"]


@click.group("cache")
def command() -> None:
    """Inspect or empty the compile cache (PASSKIT_CACHE_DIR, else the user cache directory)."""


@command.command("info")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def info(as_json: bool) -> None:
    """Show the cache folder, its entries and their size, the size limit and the entries' last use."""
    from passkit.cache.folder import MAX_BYTES_ENV, cache_info
    from passkit.errors import PasskitError
    from passkit.core.report import format_bytes

    try:
        found = cache_info()
    except ValueError as exc:  # a malformed PASSKIT_CACHE_MAX_BYTES
        raise PasskitError(str(exc)) from None
    if as_json:
        terminal.write_json(found.to_json())
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


@command.command("clear")
def clear() -> None:
    """Delete every entry of the compile cache."""
    from passkit.cache.store import cache_dir, clear_cache

    removed = clear_cache()
    terminal.out(f"removed {removed} file{'s' if removed != 1 else ''} from {cache_dir()}")
