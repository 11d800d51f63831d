"""Own bisecting a model: capture it through Dynamo as ``passkit run`` does, then bisect each graph.

The model comes from a factory (``module:factory``, ``passkit.frontends.check.ModelExample``'s contract). For
an export pipeline (``kind = "export"``) it is captured with ``torch.export``, as
``passkit.export`` captures it: one program; so for an edge pipeline, as ``passkit.to_executorch``
takes a program ``torch.export`` made. Otherwise it runs once through ``torch.compile`` with a backend that only records each graph Dynamo captures
(as a ``Program``) and what the captured graph computes on the real inputs (a ``Reference``),
then runs the graph eagerly. Each program is bisected in turn (``passkit.debug.bisect``); the
first graph with a bad step ends the search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from passkit.debug.bisect import Bisection, bisect_program
from passkit.artifacts.snapshot import snapshot_program
from passkit.errors import PasskitError

if TYPE_CHECKING:
    import pluggy

    from passkit.verify.evaluate import Reference
    from passkit.pipeline import Pipeline
    from passkit.core.program import Program
    from passkit.core.registry import Registry

__all__ = ["Captured", "capture_model", "capture_module", "bisect_model"]


@dataclass
class Captured:
    """One graph Dynamo captured: the program as captured, and what it computes."""

    label: str
    program: Program
    reference: Reference


def capture_model(spec: str, pipeline: Pipeline) -> list[Captured]:
    """Every graph Dynamo captures from one call of the model, in order."""
    from passkit.frontends.check import build_model

    example = build_model(spec)
    captured = capture_module(example.module, example.args, pipeline, kwargs=example.kwargs)
    if not captured:
        raise PasskitError(f"--model {spec}: Dynamo captured no graph to bisect")
    return captured


def capture_module(
    module: torch.nn.Module, args: Sequence[Any], pipeline: Pipeline, *, kwargs: dict[str, Any] | None = None,
    training: bool | None = None, dynamic: bool = False,
) -> list[Captured]:
    """Every graph Dynamo captures from one call of ``module`` on ``args`` and ``kwargs`` (one
    exported program for an export or edge pipeline). ``training`` defaults to: the pipeline can train
    and the module has parameters that require grad; ``dynamic`` compiles with symbolic sizes."""
    from passkit.frontends.capture import program_from_graph
    from passkit.verify.evaluate import Reference

    if pipeline.kind in ("export", "edge"):
        return [_capture_exported(module, tuple(args), dict(kwargs or {}), edge=pipeline.kind == "edge")]
    if training is None:
        training = pipeline.can_train and any(p.requires_grad for p in module.parameters())
    captured: list[Captured] = []

    def record(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        program = program_from_graph(gm, list(example_inputs))
        label = f"graph {len(captured) + 1}, {'training' if program.training else 'inference'}"
        captured.append(Captured(label, snapshot_program(program), Reference(program, list(example_inputs))))
        return gm.forward

    compiled = torch.compile(module, backend=record, dynamic=dynamic)
    with torch.set_grad_enabled(training):
        compiled(*args, **(kwargs or {}))
    return captured


def _capture_exported(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                      edge: bool = False) -> Captured:
    """The program ``passkit.export`` would run an export pipeline over: ``torch.export``'s; for an
    edge pipeline, set up as ``passkit.to_executorch`` sets it up (its steps reach ExecuTorch)."""
    from passkit.frontends.export import program_from_exported
    from passkit.verify.evaluate import Reference

    from passkit.frontends.export_capture import capture

    program, real_inputs = program_from_exported(capture(module, args, kwargs))
    if edge:
        from passkit.frontends.executorch import EdgeBridge
        from passkit.passes.edge import EDGE_NOTE

        program.notes[EDGE_NOTE] = EdgeBridge()
    with torch.no_grad():
        reference = Reference(program, real_inputs)
    return Captured("exported program, inference", snapshot_program(program), reference)


def bisect_model(
    pipeline: Pipeline,
    spec: str,
    *,
    pm: pluggy.PluginManager,
    registry: Registry,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[Bisection], list[Captured]]:
    """Bisect ``pipeline`` over each graph of the model, stopping at the first graph with a bad step."""
    graphs = capture_model(spec, pipeline)
    results = []
    for graph in graphs:
        result = bisect_program(graph.program, graph.reference, pipeline, pm=pm, registry=registry, graph=graph.label, progress=progress)
        results.append(result)
        if result.first_bad is not None:
            break
    return results, graphs
