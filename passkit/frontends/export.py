"""Own ``passkit.export``: ``torch.export`` as a way in, and a real ``ExportedProgram`` as the
way out, with the pipeline's steps between.

``torch.export.export`` (non-strict, as torch defaults) captures the model. Its graph becomes a
``Program`` whose single graph ``main`` has one placeholder per entry of the graph signature:
parameters and buffers as ``param`` and ``buffer`` inputs, lifted constants as ``buffer``
inputs too (their spec says which), user inputs as ``user`` inputs. The steps run as for
inference (``passkit.frontends.compiling.run_steps``: verification, dumps, reports, the compile
cache). The ExportedProgram is then rebuilt from the program's descriptors
(``passkit.frontends.export_signature``), never by editing torch's signature in place.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.export.graph_signature import ConstantArgument
from torch.fx import GraphModule

from passkit.core.program import Desc, GraphIO, InputInfo, OutputInfo, Program, Signature
from passkit.core.report import Report
from passkit.errors import PasskitError
from passkit.frontends.compiling import Progress, load_pipeline, run_steps
from passkit.frontends.export_capture import capture
from passkit.frontends.package import stamp_export_record
from passkit.frontends.export_signature import ExportState, exported_from_program, spec_kinds
from passkit.pipeline.exports import refuse_for_export

__all__ = ["DEFAULT_EXPORT_PIPELINE", "export", "program_from_exported", "resolve_export_pipeline"]

DEFAULT_EXPORT_PIPELINE = "export"
EXPORT_NOTE = "passkit.export"  # program.notes key: the ExportState the rebuild reads


def resolve_export_pipeline(pipeline: Any, settings: dict[str, Any]) -> Any:
    """The pipeline ``passkit.export`` runs: loaded, refused in one line when a step makes what an
    exported program cannot hold (a joint graph, a partition, generated code)."""
    resolved = load_pipeline(pipeline)
    if resolved.kind != "export":
        refuse_for_export(resolved)
    return resolved.with_settings(**settings) if settings else resolved


def export(
    model: torch.nn.Module,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None = None,
    *,
    pipeline: Any = DEFAULT_EXPORT_PIPELINE,
    dynamic_shapes: Any = None,
    progress: Progress | None = None,
    **settings: Any,
) -> torch.export.ExportedProgram:
    """Export ``model`` with ``torch.export``, run ``pipeline``'s steps over its graph, and return
    the result as an ``ExportedProgram`` (graph signature, state dict, constants, range
    constraints and module call graph kept consistent; torch's verifier accepts it).

    ``settings`` are pipeline settings (``verify``, ``dump``, ``report``, ``cache``, ...). The
    run's report is ``passkit.reports()[-1]`` and the result's ``passkit_report``.

    Raises:
        PipelineError: the pipeline is not one an exported program can come out of.
        CaptureError: the model raised, or ``torch.export`` could not capture it (one line; torch's
            error is its ``__context__``).
        PassError: a step failed.
    """
    resolved = resolve_export_pipeline(pipeline, settings)
    if not isinstance(model, torch.nn.Module):
        raise PasskitError(f"passkit.export: expected an nn.Module, got {type(model).__name__}")
    captured = capture(model, tuple(args), kwargs, dynamic_shapes)
    exported, report, program = export_program(captured, resolved, progress=progress)
    exported.passkit_report = report  # type: ignore[attr-defined]
    stamp_export_record(exported, {
        "pipeline": resolved.name,
        "fingerprint": resolved.fingerprint(),
        "tables": _tables(program, resolved),
        "facts": sorted(program.facts),
    })
    return exported


def export_program(
    captured: torch.export.ExportedProgram, pipeline: Any, *, progress: Progress | None = None
) -> tuple[torch.export.ExportedProgram, Report, Program]:
    """Run ``pipeline`` (already resolved) over an ``ExportedProgram`` and rebuild it; also the
    report and the program the steps left."""
    program, real_inputs = program_from_exported(captured)
    with torch.no_grad():
        report = run_steps(program, real_inputs, pipeline, progress=progress)
    state: ExportState = program.notes[EXPORT_NOTE]
    return exported_from_program(program, state), report, program


def _tables(program: Program, pipeline: Any) -> list[str]:
    """The decomposition tables the program went through: its target opset's, or on a compile
    cache hit (which restores graphs, not the opset) those its pipeline's steps name."""
    if program.target_opset is not None:
        return list(program.target_opset.tables)
    return [table for step in pipeline.steps if step.enabled for table in getattr(step.options, "tables", ())]


def program_from_exported(ep: torch.export.ExportedProgram) -> tuple[Program, list[Any]]:
    """A ``Program`` over a copy of ``ep``'s graph, and the real values of its inputs (the state
    dict's and constants' tensors, then the example inputs ``ep`` was exported with)."""
    gm = GraphModule(ep.graph_module, _copied_graph(ep.graph_module))
    gm.meta.update(ep.graph_module.meta)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    specs = list(ep.graph_signature.input_specs)
    kinds = spec_kinds(specs)
    for node, spec in zip(placeholders, specs):
        if isinstance(spec.arg, ConstantArgument):  # a specialized input (``use_cache=False``)
            node.meta["val"] = spec.arg.value
    fakes = [n.meta.get("val") for n in placeholders]
    inputs = [
        InputInfo(name=node.name, kind=kind, is_tensor=isinstance(fake, torch.Tensor))  # type: ignore[arg-type]
        for node, kind, fake in zip(placeholders, kinds, fakes)
    ]
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    results = list(output.args[0])
    outputs = [OutputInfo(is_tensor=isinstance(r, torch.fx.Node) and isinstance(r.meta.get("val"), torch.Tensor)) for r in results]
    signature = Signature(
        inputs=inputs,
        outputs=outputs,
        graph_io={"main": GraphIO(inputs=[Desc(info.kind, i) for i, info in enumerate(inputs)],
                                  outputs=[Desc("user", j) for j in range(len(outputs))])},
    )
    fake_mode = next((f.fake_mode for f in fakes if isinstance(f, torch.Tensor) and hasattr(f, "fake_mode")), None)
    program = Program(
        graphs={"main": gm}, signature=signature, example_inputs=[_without_grad(f) for f in fakes],
        fake_mode=fake_mode, facts={"captured"}, training=False,
    )
    state = ExportState.of(ep)
    program.notes[EXPORT_NOTE] = state
    return program, state.real_inputs(specs)


def _copied_graph(gm: GraphModule) -> torch.fx.Graph:
    graph = torch.fx.Graph()
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    return graph


def _without_grad(value: Any) -> Any:
    """A fake input that does not require grad: an exported program computes no gradients."""
    if isinstance(value, torch.Tensor) and value.requires_grad:
        return value.detach()
    return value

