"""Own everything the ``passkit`` command prints: results on stdout, progress and errors on stderr.

Commands never call ``print`` or ``click.echo`` themselves, so output conventions (one-line
errors, where JSON goes, table layout) live in one place.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

# Tables and values are rendered where ``Pipeline.explain()`` renders its plan too (below the CLI).
from passkit.pipeline.explain import format_value, text_table as table
from passkit.errors import DEBUG_ENV, debug_enabled

__all__ = [
    "DEBUG_ENV",
    "debug_enabled",
    "out",
    "note",
    "error",
    "internal_error",
    "usage_error",
    "table",
    "write_json",
    "format_value",
]



def out(text: str = "") -> None:
    """Print a result line on stdout."""
    click.echo(text)


def note(text: str) -> None:
    """Print a side remark (progress, warnings) on stderr, keeping stdout for results."""
    click.echo(text, err=True)


def error(message: str) -> None:
    """Print a user-facing error: its first line only, on stderr."""
    lines = str(message).strip().splitlines() or [""]
    click.echo(lines[0], err=True)


def internal_error(exc: BaseException) -> None:
    lines = str(exc).strip().splitlines()
    what = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    error(f"passkit: internal error in passkit or a plugin: {what} (run with {DEBUG_ENV}=1 for the traceback and report it)")


def usage_error(exc: click.ClickException) -> None:
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else "passkit"
    hint = f" (see '{where} --help')" if isinstance(exc, click.UsageError) else ""
    error(f"{where}: {exc.format_message().rstrip('.')}{hint}")


def write_json(data: Any, destination: str | None = None) -> None:
    """Write ``data`` as indented JSON to stdout (``None`` or ``"-"``) or to a file."""
    text = json.dumps(data, indent=2, default=str)
    if destination in (None, "-"):
        click.echo(text)
    else:
        Path(destination).write_text(text + "\n", encoding="utf-8")
