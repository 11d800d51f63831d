"""Own ``passkit explain``: the resolved plan of a pipeline, with the file that set each value
and the tolerance each step declares (rendered by ``passkit.pipeline.explain``, which
``Pipeline.explain()`` shares)."""

from __future__ import annotations

import click

from passkit.cli import terminal
from passkit.cli.plugin_option import plugin_option, register_plugins
from passkit.pipeline.explain import explain_text

__all__ = ["command", "explain_text"]


@click.command("explain")
@click.argument("file")
@plugin_option
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def command(file: str, plugins: tuple[str, ...], as_json: bool) -> None:
    """Show FILE's resolved plan: settings and steps, each value with the file that set it."""
    from passkit.pipeline import load_pipeline
    from passkit.core.registry import get_registry

    register_plugins(plugins)
    pipeline = load_pipeline(file, registry=get_registry())
    if as_json:
        terminal.write_json(dict(pipeline.explain()))
        return
    terminal.out(explain_text(pipeline))
