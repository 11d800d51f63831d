"""Own ``passkit run``: compile a model with a pipeline, run one step, compare with eager.

Exit codes: 0 the results match eager's; 1 they differ, from the final comparison or from a
step that ``verify = "numerics"`` caught changing them; 2 bad input (file, options, arguments);
3 the compile failed and fell back to eager (``on_error = "eager"``), so the comparison says
nothing about the compiler; 4 a step failed: its pass raised or broke a fact. The group maps
errors to codes with ``exit_code_for``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from passkit.cli import terminal
from passkit.cli.plugin_option import plugin_option, register_plugins
from passkit.verify.compare import Tolerance
from passkit.errors import EXIT_FELL_BACK, EXIT_MISMATCH, EXIT_OK, EXIT_STEP_FAILED, EXIT_USAGE, exit_code_for

if TYPE_CHECKING:
    from passkit.frontends.check import CheckResult

__all__ = ["command", "verdict", "exit_code_for", "EXIT_OK", "EXIT_MISMATCH", "EXIT_USAGE", "EXIT_FELL_BACK", "EXIT_STEP_FAILED"]


@click.command("run")
@click.argument("file", required=False, metavar="FILE")
@click.option("--model", metavar="MODULE:FACTORY", default=None,
              help="Factory returning (module, example_inputs): positional arguments, a tensor, or a dict of keyword arguments; default: the bundled transformer block.")
@click.option("--dump", "dump_dir", metavar="DIR", default=None, help="Write each step's graph code into DIR.")
@click.option("--json", "json_out", metavar="[OUT]", is_flag=False, flag_value="-", default=None,
              help="Print the result as JSON on stdout (the table and verdict go to stderr); "
                   "--json OUT writes it to the file OUT instead.")
@click.option("--report", metavar="FILE", default=None, help="Write an HTML report of the run to FILE.")
@click.option("--rtol", type=click.FloatRange(min=0), default=None, help="Relative tolerance vs eager (default: [settings] rtol).")
@click.option("--atol", type=click.FloatRange(min=0), default=None, help="Absolute tolerance vs eager (default: [settings] atol).")
@plugin_option
@click.pass_context
def command(
    ctx: click.Context, file: str, model: str | None, dump_dir: str | None, json_out: str | None, report: str | None,
    rtol: float | None, atol: float | None, plugins: tuple[str, ...],
) -> None:
    """Compile a model with pipeline FILE, run one step and compare outputs and gradients with eager.

    FILE is a path or a shipped name: ``training`` (fastest; Inductor kernels, needs a C++
    compiler), ``training-python`` (no C++ compiler, quick to compile), ``debug``.

    Exit status: 0 ok; 1 results differ from eager; 2 bad input; 3 the compile fell back to
    eager; 4 a step failed (its pass raised or broke a fact).
    """
    from passkit.frontends.check import run_check
    from passkit.cli.live import LiveTable

    file, json_out = _file_and_json(ctx, file, json_out)
    register_plugins(plugins)
    pipeline: Any = file
    if report is not None:
        from passkit.frontends.api import load_pipeline

        pipeline = load_pipeline(file).with_settings(report=report)
    # With JSON on stdout, stdout must hold only the JSON; the table and verdict move to stderr.
    json_on_stdout = json_out == "-"
    tolerance = {key: value for key, value in (("rtol", rtol), ("atol", atol)) if value is not None}
    progress = LiveTable(err=json_on_stdout, model=model or "the bundled transformer block")
    try:
        result = run_check(pipeline, model=model, dump_dir=dump_dir, progress=progress, **tolerance)
    finally:
        progress.close()
    line = verdict(result)
    if json_on_stdout:
        terminal.note(line)
    else:
        terminal.out(line)
    if json_out is not None:
        terminal.write_json(result.to_json(), json_out)
    if getattr(result, "fallbacks", None):
        ctx.exit(EXIT_FELL_BACK)
    if not result.ok:
        ctx.exit(EXIT_MISMATCH)


def _file_and_json(ctx: click.Context, file: str | None, json_out: str | None) -> tuple[str, str | None]:
    """FILE, and where the JSON goes. ``--json`` takes an optional OUT, so in ``run --json my.toml``
    it took the pipeline: without another FILE, that word is FILE and the JSON goes to stdout."""
    if file is not None:
        return file, json_out
    if json_out not in (None, "-"):
        return json_out, "-"
    param = next(p for p in ctx.command.params if p.name == "file")
    raise click.MissingParameter(ctx=ctx, param=param)


def verdict(result: CheckResult) -> str:
    """Summarise the comparison with eager in one line."""
    mode = "training" if result.training else "inference"
    fallbacks = getattr(result, "fallbacks", None) or []
    if fallbacks:
        more = f" (+{len(fallbacks) - 1} more)" if len(fallbacks) > 1 else ""
        return (
            f"FELL BACK TO EAGER: {result.pipeline} on {result.model} ({mode}): nothing was compiled, "
            f"so eager was compared with itself; the compile failed: {fallbacks[0]}{more}"
        )
    outcome = "ok" if result.ok else "MISMATCH"
    grads = "n/a" if result.grads_max_diff is None else _diff(result.grads_max_diff)
    line = (
        f"{outcome}: {result.pipeline} on {result.model} ({mode}) vs eager: "
        f"outputs max |diff| {_diff(result.outputs_max_diff)}, grads max |diff| {grads}"
    )
    if result.buffers_max_diff is not None:
        line += f", buffers max |diff| {_diff(result.buffers_max_diff)}"
    line += f" ({Tolerance(result.rtol, result.atol)})"
    mismatches = result.mismatches
    if not result.ok and mismatches:
        more = f" (+{len(mismatches) - 1} more)" if len(mismatches) > 1 else ""
        line += f"; first mismatch: {mismatches[0]}{more}"
    return line


def _diff(value: Any) -> str:
    return f"{float(value):.1e}"
