"""Own ``passkit pipelines``: the pipeline files that plugins ship, by name.

The text listing shows each file as every other command names it (relative to the working
directory, else to its package's folder: ``passkit/pipelines/training.toml``), so the table fits
a terminal; ``--json`` gives the full path.
"""

from __future__ import annotations

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
    from passkit.pipeline.messages import display_path
    from passkit.core.registry import get_registry

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
        ("name", "description", "file"), ((r["name"], r["description"], display_path(Path(r["file"]))) for r in rows)
    ))

