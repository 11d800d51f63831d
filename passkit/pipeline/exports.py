"""Own the contract of the pipelines that hand a program back rather than code to call:
``[pipeline] kind = "export"`` (``passkit.export``: an ``ExportedProgram``) and ``kind = "edge"``
(``passkit.to_executorch``: the same program lowered to ExecuTorch's Edge dialect and written
as a ``.pte``).

Such a program is one functional graph ``main`` with no gradients and no generated code. So the
plan runs as an inference plan, has no step that makes a joint graph, partitions or generates
code (each refused in one line naming the step), and ends with the ``functional`` fact; an edge
plan ends with the ``edge`` fact too (a step lowers to the Edge dialect).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from passkit.errors import PipelineError
from passkit.pipeline.contracts import plan_facts

if TYPE_CHECKING:
    from passkit.core.registry import Registry
    from passkit.pipeline.model import Pipeline

__all__ = ["EXPORT_FORBIDDEN", "PROGRAM_KINDS", "check_export", "edge_dialects", "refuse_for_export"]

# Facts whose producers make something an exported program cannot hold, and what each makes.
EXPORT_FORBIDDEN = {"joint": "makes a joint graph", "partitioned": "partitions", "compiled": "generates code"}
# Each kind that hands a program back: the facts its plan must end with, and who runs it.
PROGRAM_KINDS = {
    "export": (("functional",), "passkit.export", "an exported program", "'export'"),
    "edge": (("functional", "edge"), "passkit.to_executorch", "an ExecuTorch program", "'edge'"),
}


_VERBS = {"export": "export", "edge": "lower"}


def refuse_for_export(pipeline: Pipeline, kind: str = "export") -> None:
    """Raise at the first enabled step that a program of ``kind`` cannot come out of (whether
    or not it would run: a training-only ``joint`` in an export file is a mistake too)."""
    _, runner, what_program, example = PROGRAM_KINDS[kind]
    for step in pipeline.steps:
        if not step.enabled:
            continue
        for fact, what in EXPORT_FORBIDDEN.items():
            if fact not in step.pass_.produces:
                continue
            head = f"{pipeline.where(step)}: {step.pass_.name!r} {what}, which {what_program} cannot hold"
            if pipeline.kind == kind:  # already a plan of this kind: the step is what is wrong
                raise PipelineError(
                    f"{head}; an {kind} pipeline (kind = \"{kind}\") has no joint, partition or codegen step: "
                    f"remove this one, or {_VERBS[kind]} with {runner} and train with passkit.compile"
                )
            raise PipelineError(
                f"{head}; {runner} runs a pipeline with kind = \"{kind}\" "
                f"(no joint, partition or codegen step), such as {example}"
            )


def check_export(pipeline: Pipeline, registry: Registry) -> Pipeline:
    """``pipeline`` checked as the plan of its kind (see the module docstring); returned unchanged."""
    refuse_for_export(pipeline, pipeline.kind)
    required, _, what_program, _ = PROGRAM_KINDS[pipeline.kind]
    facts = plan_facts(pipeline, registry, training=False)
    for fact in required:
        if fact not in facts:
            producers = registry.producers(fact)
            hint = f"; add a {producers[0]!r} step" if producers else ""
            raise PipelineError(f"{pipeline.label}: no step produces fact {fact!r}, which {what_program} needs{hint}")
    return pipeline


def edge_dialects(pipeline: Pipeline) -> list[str]:
    """What each step of an edge plan sees, for ``explain``: ATen ops before the step that lowers
    to the Edge dialect (as in an export pipeline, so an export pass runs there unchanged), Edge
    ops after it (``exir_ops.edge.aten.*``: a pass that matches ``torch.ops.aten`` targets finds
    none of them), and delegated calls after the step that delegates."""
    lines = ["dialect each step sees:"]
    dialect = "ATen (as in an export pipeline)"
    for step in pipeline.steps:
        if not step.enabled:
            continue
        lines.append(f"  {step.id}: {dialect}")
        if "edge" in step.pass_.produces:
            dialect = "Edge ops (exir_ops.edge.aten.*; a pass matching torch.ops.aten targets finds none)"
        if "delegated" in step.pass_.produces:
            dialect = "Edge ops and delegated calls (executorch_call_delegate; delegated parts are out of reach)"
    return lines
