"""Own ``passkit export``: export a model through a pipeline, write the ``ExportedProgram`` (or an
AOTInductor package), and compare what was written with eager.

The model comes from ``--model mod:factory`` (``factory() -> (module, example_inputs)``), used as
the factory returns it (call ``.eval()`` there for inference). The written program is loaded back
(``torch.export.load``, or ``aoti_load_package`` with ``--package``) and run on the example
inputs; its outputs are compared with eager's within the tolerance ``passkit run`` holds results
to (``passkit.verify.compare.tolerance_for``: the settings loosened to what the steps that ran
declare). Exit codes are
``passkit run``'s: 0 ok, 1 the outputs differ, 2 bad input, 4 a step failed.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import click

from passkit.cli import terminal
from passkit.cli.plugin_option import plugin_option, register_plugins
from passkit.errors import EXIT_MISMATCH, PasskitError

__all__ = ["command", "dynamic_shapes_for"]


@click.command("export")
@click.argument("file", metavar="FILE")
@click.option("--model", metavar="MODULE:FACTORY", required=True,
              help="Factory returning (module, example_inputs).")
@click.option("-o", "--output", "out", metavar="OUT", required=True, type=click.Path(dir_okay=False),
              help="Where to write the ExportedProgram (torch.export.save), or the package with --package.")
@click.option("--package", "as_package", is_flag=True, help="Write an AOTInductor package (passkit.package) instead.")
@click.option("--dynamic", "dynamic", metavar="DIM", multiple=True,
              help="Export dimension DIM of every tensor input as dynamic (one size for all; negative counts from the end); repeatable.")
@click.option("--dump", "dump_dir", metavar="DIR", default=None, help="Write each step's graph code into DIR.")
@click.option("--report", metavar="FILE", default=None, help="Write an HTML report of the run to FILE.")
@click.option("--json", "json_out", metavar="[OUT]", is_flag=False, flag_value="-", default=None,
              help="Print the result as JSON on stdout (the table and verdict go to stderr); --json OUT writes it to OUT.")
@plugin_option
@click.pass_context
def command(ctx: click.Context, file: str, model: str, out: str, as_package: bool, dynamic: tuple[str, ...],
            dump_dir: str | None, report: str | None, json_out: str | None, plugins: tuple[str, ...]) -> None:
    """Export a model with pipeline FILE (``export``, or a file that extends it) and write it to OUT.

    Exit status: 0 the written program matches eager; 1 it differs; 2 bad input; 4 a step failed.
    """
    import torch

    from passkit.cli.live import LiveTable
    from passkit.frontends.check import build_model
    from passkit.frontends.export import export, resolve_export_pipeline
    from passkit._torch import pytree
    from passkit.verify.compare import compare_values, tolerance_for

    register_plugins(plugins)
    settings = {key: value for key, value in (("dump", "all" if dump_dir else None), ("dump_dir", dump_dir),
                                              ("report", report)) if value is not None}
    pipeline = resolve_export_pipeline(file, settings)
    example = build_model(model)
    module, args, kwargs = example.module, example.args, example.kwargs
    dynamic_shapes = dynamic_shapes_for(module, args, kwargs, dynamic)
    json_on_stdout = json_out == "-"
    click.echo(f"passkit export: exporting {model} with {pipeline.name} ({len(pipeline.steps)} steps) ...", err=True)
    progress = LiveTable(err=json_on_stdout)
    progress.begin(pipeline)
    try:
        exported = export(copy.deepcopy(module), args, kwargs, pipeline=pipeline,
                          dynamic_shapes=dynamic_shapes, progress=progress)
    finally:
        progress.close()
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    if as_package:
        from passkit import _torch
        from passkit.frontends.package import package

        written = package(exported, target)
        run = _torch.aoti_load(written)
    else:
        torch.export.save(exported, target)
        with warnings.catch_warnings():  # torch's own pytree deprecation, raised while it loads
            warnings.simplefilter("ignore", FutureWarning)
            written, run = str(target), torch.export.load(target).module()
    with torch.no_grad():
        expected = module(*args, **kwargs)
        got = run(*args, **kwargs)
    # The one tolerance rule, as run's: on a cache hit the stored records say which steps ran.
    ran = {record.position for record in exported.passkit_report.records if record.status == "ran"}
    tolerance = tolerance_for(pipeline.settings, (step for step in pipeline.steps if step.position in ran))
    diff = compare_values(pytree.tree_leaves(expected), pytree.tree_leaves(got), "output", tolerance)
    line = _verdict(diff, pipeline.name, model, written, as_package)
    (terminal.note if json_on_stdout else terminal.out)(line)
    if json_out is not None:
        terminal.write_json({
            "pipeline": pipeline.name, "model": model, "out": written, "package": as_package,
            "ok": diff.ok, "outputs_max_diff": diff.max_diff, "mismatches": [str(m) for m in diff.mismatches],
            **diff.tolerance.to_json(), "report": exported.passkit_report.to_json(),
        }, json_out)
    if not diff.ok:
        ctx.exit(EXIT_MISMATCH)


def dynamic_shapes_for(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dims: tuple[str, ...]) -> Any:
    """``torch.export``'s ``dynamic_shapes`` marking dimensions ``dims`` of every tensor input
    dynamic, one symbol per dimension shared by all inputs (a batch size), keyed by the names of
    ``module.forward``'s parameters; None for none. A negative dimension counts from the end of
    each input; one that an input does not have is bad input, naming the input and its rank."""
    import inspect

    import torch

    if not dims:
        return None
    try:
        indices = sorted({int(dim) for dim in dims})
    except ValueError:
        raise PasskitError(f"--dynamic takes a dimension number, not {next(d for d in dims if not d.lstrip('-').isdigit())!r}") from None
    symbols = {d: torch.export.Dim(f"dim{d}" if d >= 0 else f"dim_from_end{-d}") for d in indices}

    def spec(name: str, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return None
        rank = value.dim()
        for d in indices:
            if not -rank <= d < rank:
                have = f"dimensions 0 to {rank - 1} (or -{rank} to -1)" if rank else "no dimensions"
                raise PasskitError(f"--dynamic {d}: input '{name}' has rank {rank}, so {have}")
        return {d % rank: symbols[d] for d in indices}

    bound = inspect.signature(module.forward).bind(*args, **kwargs)
    return {name: spec(name, value) for name, value in bound.arguments.items()}


def _verdict(diff: Any, pipeline: str, model: str, written: str, as_package: bool) -> str:
    what = "package" if as_package else "exported program"
    outcome = "ok" if diff.ok else "MISMATCH"
    line = f"{outcome}: {pipeline} on {model}: the {what} {written} vs eager: outputs max |diff| {diff.max_diff:.1e} ({diff.tolerance})"
    if not diff.ok and diff.mismatches:
        line += f"; first mismatch: {diff.mismatches[0]}"
    return line
