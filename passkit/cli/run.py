"""Own ``passkit run``: compile a model with a pipeline, run one step, compare with eager."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from passkit.cli import terminal

if TYPE_CHECKING:
    from passkit.check import CheckResult

__all__ = ["command", "verdict"]


@click.command("run")
@click.argument("file")
@click.option("--model", metavar="MODULE:FACTORY", default=None,
              help="Factory returning (module, example_inputs); default: the bundled transformer block.")
@click.option("--dump", "dump_dir", metavar="DIR", default=None, help="Write each step's graph code into DIR.")
@click.option("--json", "json_out", metavar="OUT", default=None, help="Write the result as JSON to OUT ('-': stdout).")
@click.option("--report", metavar="FILE", default=None, help="Write an HTML report of the run to FILE.")
@click.pass_context
def command(
    ctx: click.Context, file: str, model: str | None, dump_dir: str | None, json_out: str | None, report: str | None
) -> None:
    """Compile a model with pipeline FILE, run one step and compare outputs and gradients with eager.

    FILE is a path or a shipped name: ``training`` (fastest; Inductor kernels, needs a C++
    compiler), ``training-python`` (no C++ compiler, quick to compile), ``debug``.

    Exits 1 when the compiled results differ from eager.
    """
    from passkit.check import run_check

    pipeline: Any = file
    if report is not None:
        from passkit.api import load_pipeline

        pipeline = load_pipeline(file).with_settings(report=report)
    result = run_check(pipeline, model=model, dump_dir=dump_dir, progress=terminal.progress)
    # With JSON on stdout, stdout must hold only the JSON; the verdict moves to stderr.
    json_on_stdout = json_out == "-"
    if not json_on_stdout:
        for report in result.reports:
            terminal.out(report.table())
            terminal.out()
    line = verdict(result)
    if json_on_stdout:
        terminal.note(line)
    else:
        terminal.out(line)
    if json_out is not None:
        terminal.write_json(result.to_json(), json_out)
    if not result.ok:
        ctx.exit(1)


def verdict(result: CheckResult) -> str:
    """Summarise the comparison with eager in one line."""
    mode = "training" if result.training else "inference"
    outcome = "ok" if result.ok else "MISMATCH"
    grads = "n/a" if result.grads_max_diff is None else _diff(result.grads_max_diff)
    line = (
        f"{outcome}: {result.pipeline} on {result.model} ({mode}) vs eager: "
        f"outputs max |diff| {_diff(result.outputs_max_diff)}, grads max |diff| {grads}"
    )
    if result.buffers_max_diff is not None:
        line += f", buffers max |diff| {_diff(result.buffers_max_diff)}"
    mismatches = result.mismatches
    if not result.ok and mismatches:
        more = f" (+{len(mismatches) - 1} more)" if len(mismatches) > 1 else ""
        line += f"; first mismatch: {mismatches[0]}{more}"
    return line


def _diff(value: Any) -> str:
    return f"{float(value):.1e}"
