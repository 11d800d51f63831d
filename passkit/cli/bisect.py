"""Own ``passkit bisect``: name the first step that changes numerics or crashes (and inside it
the first bad pattern application), and write a minimal pipeline that still shows it
(``passkit.debug.bisect``), on a model (``--model``) or a reproducer folder (``--repro``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from passkit.cli import terminal
from passkit.cli.plugin_option import plugin_option, register_plugins
from passkit.errors import exit_code_for_kind

if TYPE_CHECKING:
    from passkit.debug.bisect import Bisection
    from passkit.debug.trial import Outcome
    from passkit.pipeline import Pipeline

__all__ = ["command"]


@click.command("bisect")
@click.argument("file", required=False)
@click.option("--model", metavar="MODULE:FACTORY", default=None,
              help="Factory returning (module, example_inputs); default: the bundled transformer block.")
@click.option("--repro", "repro", metavar="DIR", default=None,
              help="Bisect a reproducer folder (its program, inputs and pipeline) instead of FILE and a model.")
@click.option("--inductor", is_flag=True,
              help="FILE is mounted in stock torch.compile's Inductor slots: bisect its steps there.")
@click.option("--out", metavar="FILE", default=None,
              help="Where to write the minimal pipeline (default: <pipeline name>-minimal.toml).")
@plugin_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def command(
    ctx: click.Context, file: str | None, model: str | None, repro: str | None, inductor: bool, out: str | None,
    plugins: tuple[str, ...], as_json: bool,
) -> None:
    """Find the first step of pipeline FILE that changes the model's numerics or crashes.

    Inside a step that applies patterns (rewrite) it goes on to the first bad pattern
    application. Prints 'first bad step: <file>: steps[i] (<id>)', writes a minimal pipeline
    that still fails, and a reproducer. With --repro DIR in place of FILE and --model, it
    bisects a reproducer folder. With --inductor, FILE is a mounted file (passkit.inductor_options)
    and each trial compiles the model with stock torch.compile. Exit status: 0 every step is
    good; 1 the first bad step changes numerics; 2 bad input; 4 the first bad step raises or
    breaks a fact.
    """
    from passkit.debug.bisect import confirm, write_minimal
    from passkit.errors import PasskitError
    from passkit.core.plugins import get_plugin_manager
    from passkit.core.registry import get_registry

    if repro is not None and (file is not None or model is not None):
        raise PasskitError(f"--repro {repro}: give either a reproducer folder or FILE with --model, not both")
    if repro is None and file is None:
        raise PasskitError("passkit bisect: give a pipeline FILE (with --model) or --repro DIR")
    register_plugins(plugins)
    registry, pm = get_registry(), get_plugin_manager()
    if inductor:
        if repro is not None or file is None:
            raise PasskitError("passkit bisect --inductor: give a mounted pipeline FILE (with --model), not --repro")
        _bisect_mounted(ctx, file, model, as_json, pm, registry)
        return
    if repro is not None:
        from passkit.debug.bisect_repro import bisect_reproducer

        pipeline, result, captured = bisect_reproducer(Path(repro), pm=pm, registry=registry, progress=terminal.note)
        spec, results, graphs = f"reproducer {repro}", [result], [captured]
    else:
        from passkit.frontends.api import load_pipeline
        from passkit.frontends.check import DEFAULT_MODEL
        from passkit.debug.bisect_model import bisect_model

        assert file is not None
        pipeline = load_pipeline(file)
        spec = model or DEFAULT_MODEL
        results, graphs = bisect_model(pipeline, spec, pm=pm, registry=registry, progress=terminal.note)
    found = results[-1] if results[-1].first_bad is not None else None
    confirmed = None
    path = None
    if found is not None:
        path = write_minimal(pipeline, found, Path(out or f"{pipeline.name}-minimal.toml"),
                             model=None if repro is not None else spec, plugins=plugins)
        graph = graphs[len(results) - 1]
        confirmed = confirm(
            path, graph.program, graph.reference, pm=pm, registry=registry, expected=found.outcome.kind, bisection=found
        )
    if as_json:
        terminal.write_json(_json(pipeline, spec, results, path, confirmed))
    else:
        terminal.out(_text(pipeline, spec, results, path, confirmed))
    if found is not None:
        ctx.exit(exit_code_for_kind(found.outcome.kind))


def _bisect_mounted(ctx: click.Context, file: str, model: str | None, as_json: bool, pm: Any, registry: Any) -> None:
    from passkit.frontends.check import DEFAULT_MODEL
    from passkit.debug.bisect_inductor import bisect_mounted
    from passkit.pipeline import load_pipeline

    pipeline = load_pipeline(file, registry=registry, mounted=True)
    spec = model or DEFAULT_MODEL
    result = bisect_mounted(pipeline, spec, pm=pm, registry=registry, progress=terminal.note)
    bad, application = result.first_bad, result.pattern_application
    if as_json:
        terminal.write_json({
            "pipeline": pipeline.label, "model": spec, "inductor": True,
            "first_bad_step": None if bad is None else {
                "number": bad.position + 1, "id": bad.id, "pass": bad.pass_name, "slot": bad.slot,
                "label": pipeline.where(bad), "kind": result.outcome.kind, "message": result.outcome.message,
                "pattern_application": None if application is None else {
                    **dataclasses.asdict(application), "nodes": list(application.nodes),
                    "number": result.application_number, "of": result.applications},
            },
            "trials": result.trials,
        })
    elif bad is None:
        terminal.out(f"every step is good: {pipeline.label} mounted in torch.compile on {spec} agrees with eager")
    else:
        lines = [f"first bad step: {pipeline.where(bad)} (slot {bad.slot})",
                 f"  {result.outcome.kind}: {result.outcome.message}"]
        if application is not None:
            lines.append(f"  first bad pattern application: {application.name} (application "
                         f"{result.application_number} of {result.applications}), graph {application.graph}, nodes {', '.join(application.nodes) or '-'}")
        terminal.out("\n".join(lines))
    if bad is not None:
        ctx.exit(exit_code_for_kind(result.outcome.kind))


def _text(pipeline: Pipeline, spec: str, results: list[Bisection], path: Path | None, confirmed: Outcome | None) -> str:
    from passkit.verify.compare import tolerance_for

    last = results[-1]
    if last.first_bad is None:
        tolerance = tolerance_for(pipeline.settings, (step for step in pipeline.steps if step.enabled))
        return (f"every step is good: {pipeline.label} on {spec} ({len(results)} graph(s)) agrees with the captured "
                f"program ({tolerance})")
    lines = [
        f"first bad step: {pipeline.where(last.first_bad)}",
        f"  {last.graph}: {last.outcome.kind}: {last.outcome.message}",
    ]
    application = last.pattern_application
    if application is not None:
        lines.append(
            f"  first bad pattern application: {application.name} (application {application.index} of "
            f"{last.applications}), graph {application.graph}, nodes {', '.join(application.nodes) or '-'}"
            + (f" ({application.source})" if application.source else "")
        )
    elif last.applications:
        lines.append(f"  no single pattern application to blame: it fails with all {last.applications} vetoed")
    steps = ", ".join(step.id for step in last.minimal)
    lines.append(f"minimal pipeline: {path} ({len(last.minimal)} steps: {steps}), {_reproduces(pipeline, last, confirmed)}")
    if confirmed is not None and confirmed.repro:
        lines.append(f"reproducer: {confirmed.repro}")
    return "\n".join(lines)


def _reproduces(pipeline: Pipeline, last: Bisection, confirmed: Outcome | None) -> str:
    """Whether running the minimal pipeline failed as the bisection did; if not, how it ended."""
    from passkit.verify.compare import tolerance_for

    if confirmed is not None and confirmed.kind == last.outcome.kind:
        return "reproduces"
    if confirmed is None or confirmed.kind is None:
        assert last.first_bad is not None
        ran = [step for step in last.minimal if step.position <= last.first_bad.position]
        return f"does NOT reproduce: it agrees with the captured program ({tolerance_for(pipeline.settings, ran)})"
    return f"does NOT reproduce: it fails differently ({confirmed.kind}): {confirmed.message}"


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
            "pattern_application": None if last.pattern_application is None else {
                **dataclasses.asdict(last.pattern_application),
                "nodes": list(last.pattern_application.nodes),
                "of": last.applications,
            },
        },
        "minimal_pipeline": None if path is None else {
            "file": str(path),
            "steps": [step.id for step in last.minimal],
            "reproduces": confirmed is not None and confirmed.kind == last.outcome.kind,
            "reproducer": confirmed.repro if confirmed is not None else "",
        },
        "graphs": [{"graph": r.graph, "trials": r.trials} for r in results],
    }
