"""Own ``passkit validate``: load pipeline files (which checks their contracts) without running them."""

from __future__ import annotations

from typing import Any

import click

from passkit.cli import terminal
from passkit.cli.plugin_option import plugin_option, register_plugins
from passkit.errors import EXIT_USAGE

__all__ = ["command", "validate_file"]


@click.command("validate")
@click.argument("files", nargs=-1, required=True)
@plugin_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per file.")
@click.pass_context
def command(ctx: click.Context, files: tuple[str, ...], plugins: tuple[str, ...], as_json: bool) -> None:
    """Check pipeline FILEs (paths or pipeline names); exit 2 if any is invalid."""
    register_plugins(plugins)
    results = [validate_file(name) for name in files]
    if as_json:
        terminal.write_json(results)
    else:
        for result in results:
            if result["ok"]:
                terminal.out(f"ok  {result['file']} ({result['steps']} steps)")
            else:
                terminal.error(result["error"])
    if not all(result["ok"] for result in results):
        ctx.exit(EXIT_USAGE)


def validate_file(name: str) -> dict[str, Any]:
    """Load one pipeline (loading checks its contracts); report the outcome as data."""
    from passkit.errors import PasskitError
    from passkit.pipeline import load_pipeline
    from passkit.core.registry import get_registry

    try:
        pipeline = load_pipeline(name, registry=get_registry())
    except PasskitError as exc:
        if terminal.debug_enabled():
            raise
        return {"file": name, "ok": False, "steps": None, "error": str(exc).strip().splitlines()[0]}
    return {"file": name, "ok": True, "steps": len(pipeline.steps), "error": None}
