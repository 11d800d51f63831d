"""Own ``passkit bisect``: name the first step that changes numerics or crashes, and write a
minimal pipeline that still shows it (``passkit.debug.bisect``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from passkit.cli import terminal
from passkit.cli.plugin_option import plugin_option, register_plugins

if TYPE_CHECKING:
    from passkit.debug.bisect import Bisection, Outcome
    from passkit.pipeline import Pipeline

__all__ = ["command"]


@click.command("bisect")
@click.argument("file")
@click.option("--model", metavar="MODULE:FACTORY", default=None,
              help="Factory returning (module, example_inputs); default: the bundled transformer block.")
@click.option("--out", metavar="FILE", default=None,
              help="Where to write the minimal pipeline (default: <pipeline name>-minimal.toml).")
@plugin_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def command(ctx: click.Context, file: str, model: str | None, out: str | None, plugins: tuple[str, ...], as_json: bool) -> None:
    """Find the first step of pipeline FILE that changes the model's numerics or crashes.

    Prints 'first bad step: <file>: steps[i] (<id>)', writes a minimal pipeline that still
    fails, and a reproducer. Exits 1 when a bad step is found, 0 when every step is good.
    """
    from passkit.api import load_pipeline
    from passkit.check import DEFAULT_MODEL
    from passkit.debug.bisect import confirm, write_minimal
    from passkit.debug.bisect_model import bisect_model
    from passkit.plugins import get_plugin_manager
    from passkit.registry import get_registry

    register_plugins(plugins)
    pipeline = load_pipeline(file)
    spec = model or DEFAULT_MODEL
    registry, pm = get_registry(), get_plugin_manager()
    results, graphs = bisect_model(pipeline, spec, pm=pm, registry=registry, progress=terminal.note)
    found = results[-1] if results[-1].first_bad is not None else None
    confirmed = None
    path = None
    if found is not None:
        path = write_minimal(pipeline, found, Path(out or f"{pipeline.name}-minimal.toml"))
        graph = graphs[len(results) - 1]
        confirmed = confirm(path, graph.program, graph.reference, pm=pm, registry=registry, expected=found.outcome.kind)
    if as_json:
        terminal.write_json(_json(pipeline, spec, results, path, confirmed))
    else:
        terminal.out(_text(pipeline, spec, results, path, confirmed))
    if found is not None:
        ctx.exit(1)


def _text(pipeline: Pipeline, spec: str, results: list[Bisection], path: Path | None, confirmed: Outcome | None) -> str:
    last = results[-1]
    if last.first_bad is None:
        return f"every step is good: {pipeline.label} on {spec} ({len(results)} graph(s)) agrees with the captured program"
    lines = [
        f"first bad step: {pipeline.where(last.first_bad)}",
        f"  {last.graph}: {last.outcome.kind}: {last.outcome.message}",
    ]
    if last.first_bad.pass_name == "rewrite":
        lines.append("  pattern application: not bisected (needs the pattern engine's should-apply hook)")
    steps = ", ".join(step.id for step in last.minimal)
    reproduces = "reproduces" if confirmed is not None and confirmed.kind == last.outcome.kind else "does NOT reproduce"
    lines.append(f"minimal pipeline: {path} ({len(last.minimal)} steps: {steps}), {reproduces}")
    if confirmed is not None and confirmed.repro:
        lines.append(f"reproducer: {confirmed.repro}")
    return "\n".join(lines)


def _json(pipeline: Pipeline, spec: str, results: list[Bisection], path: Path | None, confirmed: Outcome | None) -> dict[str, Any]:
    last = results[-1]
    bad = last.first_bad
    return {
        "pipeline": pipeline.label,
        "model": spec,
        "first_bad_step": None if bad is None else {
            "number": bad.position + 1,
            "position": bad.position,
            "id": bad.id,
            "pass": bad.pass_name,
            "label": pipeline.where(bad),
            "graph": last.graph,
            "kind": last.outcome.kind,
            "message": last.outcome.message,
            "pattern_application": last.pattern_application,
        },
        "minimal_pipeline": None if path is None else {
            "file": str(path),
            "steps": [step.id for step in last.minimal],
            "reproduces": confirmed is not None and confirmed.kind == last.outcome.kind,
            "reproducer": confirmed.repro if confirmed is not None else "",
        },
        "graphs": [{"graph": r.graph, "trials": r.trials} for r in results],
    }
