"""Own ``passkit pipelines``: the pipeline files that plugins ship, by name.

The text listing shows each file relative to the working directory when it lies below it, else
relative to the import root it was found under (``passkit/pipelines/training.toml``), so the
table fits a terminal; ``--json`` gives the full path.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from passkit.cli import terminal

__all__ = ["command"]


@click.command("pipelines")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def command(as_json: bool) -> None:
    """List the registered pipelines: name, description and file."""
    from passkit.errors import PasskitError
    from passkit.pipeline import load_pipeline
    from passkit.registry import get_registry

    registry = get_registry()
    rows = []
    for name in sorted(registry.pipelines):
        path = registry.pipelines[name]
        try:
            description = load_pipeline(path, registry=registry).description
        except PasskitError as exc:
            # A broken shipped file should not hide the others; show why it is broken instead.
            description = f"invalid: {exc}"
        rows.append({"name": name, "description": description, "file": str(path)})
    if as_json:
        terminal.write_json(rows)
        return
    if not rows:
        terminal.out("no pipelines registered")
        return
    terminal.out(terminal.table(
        ("name", "description", "file"), ((r["name"], r["description"], short_path(Path(r["file"]))) for r in rows)
    ))


def short_path(path: Path) -> str:
    """``path`` relative to the working directory, else to the deepest ``sys.path`` entry above
    it, else to the folder holding the Python package it lies in."""
    if not path.is_absolute():
        return str(path)
    bases = [Path.cwd(), *sorted((Path(p) for p in sys.path if p), key=lambda p: len(p.parts), reverse=True)]
    package = next((parent for parent in path.parents if (parent / "__init__.py").is_file()), None)
    while package is not None and (package.parent / "__init__.py").is_file():
        package = package.parent
    if package is not None:
        bases.append(package.parent)
    for base in bases:
        try:
            return str(path.relative_to(base.resolve()))
        except (ValueError, OSError):
            continue
    return str(path)
