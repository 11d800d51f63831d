"""Own the step loop: run a pipeline's steps over a program, in order, and report each one.

The loop decides whether a step runs (``enabled``, ``when``, training-only passes), checks the
step's required facts, calls the ``passkit_run_step`` hook, judges change by comparing graph
hashes (not the pass's word), and keeps the program's facts up to date. Timing, dumps and
verification are not here: they are wrapper hookimpls in ``passkit.instruments`` around the hook
call. This module's own ``passkit_run_step`` (the built-in plugin "runner") applies the pass.

The program is transformed in place; a failing step leaves it as the step left it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from passkit.errors import PassError, PipelineError, VerificationError
from passkit.hookspecs import hookimpl
from passkit.report import Report, StepRecord

if TYPE_CHECKING:
    import pluggy
    import pydantic

    from passkit.pass_api import Pass
    from passkit.pipeline import Pipeline, Settings, Step
    from passkit.program import Program
    from passkit.registry import Registry

__all__ = [
    "StepContext",
    "run_pipeline",
    "passkit_run_step",
    "pipeline_label",
    "step_label",
    "facts_after",
]


@dataclass
class StepContext:
    """Everything a ``passkit_run_step`` implementation may read or annotate for one step.

    ``graph_hash_before`` is the program's graph hash before the step, so wrappers can tell
    whether the step changed the graphs without hashing twice.
    """

    position: int
    step: Step
    pass_: Pass
    options: pydantic.BaseModel
    program: Program
    pipeline: Pipeline
    settings: Settings
    record: StepRecord
    previous: list[str]
    reference: Any | None
    graph_hash_before: str = ""

    @property
    def graphs_changed(self) -> bool:
        """Whether the graphs differ from what they were before the step (by hash)."""
        return self.program.graph_hash() != self.graph_hash_before

    @property
    def label(self) -> str:
        """``<file>: steps[i] (<id>)``: how every error about this step begins."""
        return step_label(self.pipeline, self.step)


def pipeline_label(pipeline: Pipeline) -> str:
    """Name a pipeline in messages: its file, or its name when it came from Python."""
    label = getattr(pipeline, "label", "")
    if label:
        return label
    return str(pipeline.source) if pipeline.source is not None else pipeline.name


def step_label(pipeline: Pipeline, step: Step) -> str:
    """``<file>: steps[i] (<id>)``, naming the file and index where the step was written."""
    location = getattr(step, "location", "")
    return location or f"{pipeline_label(pipeline)}: steps[{step.position}] ({step.id})"


def facts_after(facts: set[str], pass_: Pass, *, graphs_changed: bool) -> set[str]:
    """Return the facts that hold after ``pass_`` ran on a program holding ``facts``.

    Changed graphs make compiled callables stale, so ``compiled`` survives a change only when
    the step itself produces it.
    """
    after = (set(facts) | pass_.produces) - pass_.invalidates
    if graphs_changed and "compiled" in after and "compiled" not in pass_.produces:
        after.discard("compiled")
    return after


@hookimpl
def passkit_run_step(context: StepContext) -> bool:
    """Apply the step's pass with its options; return the pass's own claim of change."""
    return context.pass_.run(context.program, context.options)


def run_pipeline(
    pipeline: Pipeline,
    program: Program,
    *,
    pm: pluggy.PluginManager | None = None,
    registry: Registry | None = None,
    reference: Any | None = None,
    progress: Callable[[StepRecord], None] | None = None,
) -> Report:
    """Run every step of ``pipeline`` over ``program`` (in place) and return the report.

    Raises:
        PipelineError: a step needs a fact the program lacks, or names an unknown pass.
        PassError: a step raised; the message names the step and the steps that ran before.
        VerificationError: with ``verify`` on, a step broke a fact or changed numerics.
    """
    pm, registry = _resolve_plugins(pm, registry)
    report = Report(pipeline=pipeline.name, records=[])
    previous: list[str] = []
    started = time.perf_counter()
    for step in pipeline.steps:
        pass_ = _lookup_pass(registry, pipeline, step)
        record = StepRecord(position=step.position, id=step.id, pass_name=step.pass_name)
        report.records.append(record)
        skip_reason = _skip_reason(step, pass_, program)
        if skip_reason:
            record.status = "skipped"
            record.reason = skip_reason
        else:
            _check_requires(pipeline, step, pass_, program)
            context = StepContext(
                position=step.position,
                step=step,
                pass_=pass_,
                options=step.options,
                program=program,
                pipeline=pipeline,
                settings=pipeline.settings,
                record=record,
                previous=list(previous),
                reference=reference,
            )
            _run_step(pm, context)
            previous.append(step.id)
        if progress is not None:
            progress(record)
    report.seconds = time.perf_counter() - started
    return report


def _run_step(pm: pluggy.PluginManager, context: StepContext) -> None:
    program, record = context.program, context.record
    program.stats.clear()
    record.nodes_before = program.node_count()
    context.graph_hash_before = program.graph_hash()
    try:
        claimed = pm.hook.passkit_run_step(context=context)
    except VerificationError:
        raise
    except Exception as exc:
        raise PassError(_failure_message(context, exc)) from exc
    changed = program.graph_hash() != context.graph_hash_before
    record.changed = changed
    record.claimed_changed = None if claimed is None else bool(claimed)
    record.nodes_after = program.node_count()
    record.stats = dict(program.stats)
    had_compiled = "compiled" in program.facts
    program.facts = facts_after(program.facts, context.pass_, graphs_changed=changed)
    if had_compiled and "compiled" not in program.facts:
        program.compiled.clear()  # the callables were built from graphs that no longer exist


def _failure_message(context: StepContext, exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    what = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    after = f"after: {', '.join(context.previous)}" if context.previous else "first step"
    return f"{context.label} failed: {what} ({after})"


def _skip_reason(step: Step, pass_: Pass, program: Program) -> str:
    if not step.enabled:
        return "disabled"
    kind = "training" if program.training else "inference"
    if step.when is not None and step.when != kind:
        return f"when = {step.when}"
    if pass_.training_only and not program.training:
        return "inference program"
    return ""


def _check_requires(pipeline: Pipeline, step: Step, pass_: Pass, program: Program) -> None:
    missing = sorted(pass_.requires - program.facts)
    if missing:
        facts = ", ".join(sorted(program.facts)) or "none"
        raise PipelineError(
            f"{step_label(pipeline, step)}: requires fact '{missing[0]}', which the program lacks (facts: {facts})"
        )


def _lookup_pass(registry: Registry, pipeline: Pipeline, step: Step) -> Pass:
    try:
        return registry.get_pass(step.pass_name)
    except KeyError:
        raise PipelineError(f"{step_label(pipeline, step)}: unknown pass '{step.pass_name}'") from None


def _resolve_plugins(
    pm: pluggy.PluginManager | None, registry: Registry | None
) -> tuple[pluggy.PluginManager, Registry]:
    if pm is None:
        from passkit.plugins import get_plugin_manager

        pm = get_plugin_manager()
        if registry is None:
            from passkit.registry import get_registry

            registry = get_registry()
    if registry is None:
        from passkit.registry import build_registry

        registry = build_registry(pm)
    return pm, registry
