"""Own ``passkit repro``: replay a reproducer's failing step without the user's model
(``passkit.artifacts.reproducer``)."""

from __future__ import annotations

from pathlib import Path

import click

from passkit.cli import terminal
from passkit.cli.plugin_option import plugin_option, register_plugins
from passkit.errors import exit_code_for_kind

__all__ = ["command"]


@click.command("repro")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@plugin_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def command(ctx: click.Context, folder: Path, plugins: tuple[str, ...], as_json: bool) -> None:
    """Replay the failing step of reproducer FOLDER (written under settings.repro_dir).

    Exit status: 0 it does not fail the same way (the fix worked); 1 it changes numerics again;
    2 bad input; 4 it raises or breaks a fact again.
    """
    from passkit.debug.replay import replay
    from passkit.core.plugins import get_plugin_manager
    from passkit.core.registry import get_registry

    register_plugins(plugins)
    result = replay(folder, pm=get_plugin_manager(), registry=get_registry())
    for note in result.version_notes:
        terminal.note(f"passkit repro: {note}")
    if as_json:
        terminal.write_json(result.to_json())
    elif result.reproduced:
        terminal.out(f"reproduced ({result.kind}): {result.message}")
    elif result.kind is None:
        within = f" within {result.tolerance}" if result.tolerance else ""
        terminal.out(f"did not reproduce: {result.label} ran cleanly{within} (recorded: {result.recorded_message})")
    else:
        terminal.out(f"did not reproduce: {result.label} failed differently ({result.kind}): {result.message}")
    if result.reproduced:
        ctx.exit(exit_code_for_kind(result.kind))
