"""Own ``passkit fuzz``: random programs through a pipeline (or one pass of it), compared with
eager; each difference reduced to a minimal program with its first bad step and a reproducer
(``passkit.fuzz``)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from passkit.cli import terminal
from passkit.cli.plugin_option import plugin_option, register_plugins
from passkit.errors import EXIT_MISMATCH, EXIT_STEP_FAILED, PasskitError

__all__ = ["command", "parse_duration"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``5m``, ``1h`` -> seconds; a one-line error otherwise."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise PasskitError(f"--time {text!r}: give a positive duration such as 90s, 5m or 1h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


@click.command("fuzz")
@click.argument("pipeline")
@click.option("--pass", "pass_id", metavar="ID", default=None,
              help="Fuzz one pass (or step id) alone, in the smallest pipeline made from PIPELINE that loads with it.")
@click.option("--programs", "count", type=click.IntRange(min=1), default=None, help="How many programs to draw (default 200).")
@click.option("--time", "duration", metavar="DURATION", default=None, help="Draw programs for this long instead (90s, 5m, 1h).")
@click.option("--seed", type=int, default=0, show_default=True, help="The seed; the same seed draws the same programs.")
@click.option("--out", metavar="DIR", default="passkit-fuzz", show_default=True,
              help="Where each difference's minimal program, minimal pipeline and reproducer go.")
@click.option("--no-reduce", is_flag=True, help="Count differences without reducing or bisecting them.")
@plugin_option
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (progress goes to stderr).")
@click.pass_context
def command(
    ctx: click.Context, pipeline: str, pass_id: str | None, count: int | None, duration: str | None, seed: int,
    out: str, no_reduce: bool, plugins: tuple[str, ...], as_json: bool,
) -> None:
    """Compile random programs with PIPELINE and compare each with eager.

    Compared: outputs, gradients, inputs mutated, which outputs alias which inputs, and
    requires_grad; in training (with a backward), inference, or export for an export pipeline.
    A program torch's own path (aot_eager; torch.export with run_decompositions) fails or
    differs on too is skipped and counted. Each difference is reduced to a minimal program,
    bisected to its first bad step, and written under --out with a reproducer that
    `passkit repro` replays.

    Exit status: 0 no difference; 1 results differ from eager; 2 bad input; 4 the only
    differences are failures (a step raised where torch's path runs).
    """
    from passkit.core.plugins import get_plugin_manager
    from passkit.core.registry import get_registry
    from passkit.frontends.api import load_pipeline
    from passkit.fuzz.generator import require_hypothesis
    from passkit.fuzz.session import fuzz

    if count is not None and duration is not None:
        raise PasskitError("passkit fuzz: give --programs N or --time DURATION, not both")
    seconds = parse_duration(duration) if duration is not None else None
    require_hypothesis()
    register_plugins(plugins)
    registry, pm = get_registry(), get_plugin_manager()
    resolved = load_pipeline(pipeline)
    if pass_id is not None:
        from passkit.debug.alone import pipeline_alone

        if pass_id not in registry.passes and all(step.id != pass_id for step in resolved.steps):
            raise PasskitError(f"--pass {pass_id}: no such pass or step id in {resolved.label}")
        resolved = pipeline_alone(resolved, pass_id, registry)
        terminal.note(f"fuzz: {pass_id} alone: steps {', '.join(step.id for step in resolved.steps)}")
    summary = fuzz(
        resolved, seed=seed, programs_count=count if count is not None or seconds is not None else 200,
        seconds=seconds, out=Path(out), reduce=not no_reduce, pm=pm, registry=registry, plugins=plugins,
        progress=terminal.note,
    )
    if as_json:
        terminal.write_json(summary.to_json())
    else:
        lines = [f"fuzz {resolved.label} (seed {seed}): {summary.line()}"]
        lines += ["  " + line for case in summary.cases for line in case.lines()]
        terminal.out("\n".join(lines))
    if summary.differences:
        only_crashes = set(summary.kinds) == {"crash"}
        ctx.exit(EXIT_STEP_FAILED if only_crashes else EXIT_MISMATCH)
