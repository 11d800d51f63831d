"""Own the contract of an export pipeline (``[pipeline] kind = "export"``).

``passkit.export`` hands the program back as an ``ExportedProgram``: one functional graph
``main`` that torch's verifier accepts, with no gradients and no generated code. So an export
plan runs as an inference plan, has no step that makes a joint graph, partitions or generates
code (each refused in one line naming the step), and ends with the ``functional`` fact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from passkit.errors import PipelineError
from passkit.pipeline.contracts import plan_facts

if TYPE_CHECKING:
    from passkit.core.registry import Registry
    from passkit.pipeline.model import Pipeline

__all__ = ["EXPORT_FORBIDDEN", "check_export", "refuse_for_export"]

# Facts whose producers make something an exported program cannot hold, and what each makes.
EXPORT_FORBIDDEN = {"joint": "makes a joint graph", "partitioned": "partitions", "compiled": "generates code"}
REQUIRED_AT_END = "functional"


def refuse_for_export(pipeline: Pipeline) -> None:
    """Raise at the first enabled step that an exported program cannot come out of (whether or
    not it would run: a training-only ``joint`` in an export file is a mistake too)."""
    for step in pipeline.steps:
        if not step.enabled:
            continue
        for fact, what in EXPORT_FORBIDDEN.items():
            if fact not in step.pass_.produces:
                continue
            head = f"{pipeline.where(step)}: {step.pass_.name!r} {what}, which an exported program cannot hold"
            if pipeline.kind == "export":  # already an export plan: the step is what is wrong
                raise PipelineError(
                    f"{head}; an export pipeline (kind = \"export\") has no joint, partition or codegen step: "
                    "remove this one, or export with passkit.export and train with passkit.compile"
                )
            raise PipelineError(
                f"{head}; passkit.export runs a pipeline with kind = \"export\" "
                "(no joint, partition or codegen step), such as 'export'"
            )


def check_export(pipeline: Pipeline, registry: Registry) -> Pipeline:
    """``pipeline`` checked as an export plan (see the module docstring); returned unchanged."""
    refuse_for_export(pipeline)
    facts = plan_facts(pipeline, registry, training=False)
    if REQUIRED_AT_END not in facts:
        producers = registry.producers(REQUIRED_AT_END)
        hint = f"; add a {producers[0]!r} step" if producers else ""
        raise PipelineError(
            f"{pipeline.label}: no step produces fact {REQUIRED_AT_END!r}, which an exported program needs{hint}"
        )
    return pipeline
