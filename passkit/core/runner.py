"""Own the step loop: run a pipeline's steps over a program, in order, and report each one.

The loop asks ``facts.skip_reason`` whether a step applies and ``passkit_should_run_step``
whether it runs, checks the step's required facts, calls the ``passkit_run_step`` hook, judges
change by comparing graph hashes (not the pass's word), and keeps the program's facts up to
date with ``facts.after``. It receives the plugin manager and the registry from its caller and
reaches for no globals. Applying the pass, timing, dumps and verification are all hookimpls.

The program is transformed in place; a failing step leaves it as the step left it.

Python's full garbage collections wait while the steps run (``full_collections_deferred``).
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

from passkit.core import facts as fact_rules
from passkit.errors import PassError, PipelineError, VerificationError
from passkit.core.failed_node import where_it_failed
from passkit.core.hookspecs import StepContext
from passkit.core.report import Report, StepRecord

if TYPE_CHECKING:
    import pluggy

    from passkit.pipeline import Pipeline, Step
    from passkit.core.program import Program
    from passkit.core.registry import Registry

__all__ = ["full_collections_deferred", "run_pipeline"]

# A full collection once this many young collections have passed: never, while deferred.
_DEFERRED = 1_000_000_000
_deferring_lock = threading.Lock()
_deferring: dict[str, Any] = {"depth": 0, "thresholds": None}  # the thresholds are the process's


def run_pipeline(
    pipeline: Pipeline,
    program: Program,
    *,
    pm: pluggy.PluginManager,
    registry: Registry,
    reference: Any | None = None,
    progress: Callable[[StepRecord], None] | None = None,
) -> Report:
    """Run every step of ``pipeline`` over ``program`` (in place) and return the report.

    ``pm`` supplies the hooks; ``registry`` the facts that steps establish and break.
    ``progress`` gets each step's record as it finishes; instruments send it events through
    ``context.progress`` (``passkit.core.progress``).

    Raises:
        PipelineError: a step needs a fact the program lacks.
        PassError: a step raised; the message names the step and the steps that ran before.
        VerificationError: with ``verify`` on, a step broke a fact or changed numerics.
    """
    report = Report(pipeline=pipeline.name, records=[])
    started = time.perf_counter()
    with full_collections_deferred():
        _run_steps(pipeline, program, pm, registry, reference, progress, report)
    report.seconds = time.perf_counter() - started
    return report


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    """While inside, Python's collector runs its young generations only; the thresholds are
    back as they were on exit, and the next full collection comes when it is due.

    A compile allocates graphs, nodes and fake tensors by the hundred thousand, and each full
    collection walks every object alive, torch's own included: the number of collections and
    the cost of each both grow with the program, so their time grows faster than the program
    (block stack, cold compile: 2.5 s at 24 layers, 4.1 s at 48; deferred, 1.4 s and 2.3 s,
    most of it the one full collection due after the steps). Short-lived cycles still go in the
    young collections.
    Re-entrant and shared by threads: the first to enter defers, the last to leave restores. A
    collector that is off stays off.
    """
    with _deferring_lock:
        _deferring["depth"] += 1
        if _deferring["depth"] == 1:
            thresholds = gc.get_threshold()
            _deferring["thresholds"] = thresholds
            gc.set_threshold(thresholds[0], thresholds[1], _DEFERRED)
    try:
        yield
    finally:
        with _deferring_lock:
            _deferring["depth"] -= 1
            if _deferring["depth"] == 0 and gc.get_threshold()[2] == _DEFERRED:  # nobody changed them meanwhile
                gc.set_threshold(*_deferring["thresholds"])


def _run_steps(
    pipeline: Pipeline,
    program: Program,
    pm: pluggy.PluginManager,
    registry: Registry,
    reference: Any | None,
    progress: Callable[[StepRecord], None] | None,
    report: Report,
) -> None:
    previous: list[str] = []
    for step in pipeline.steps:
        record = StepRecord(position=step.position, id=step.id, pass_name=step.pass_.name)
        report.records.append(record)
        context = StepContext(
            step=step,
            program=program,
            pipeline=pipeline,
            record=record,
            previous=list(previous),
            reference=reference,
            known_facts=registry.facts,
            hook=pm.hook,
            progress=progress,
        )
        reason = fact_rules.skip_reason(enabled=step.enabled, when=step.when, pass_=step.pass_, training=program.training)
        if not reason and pm.hook.passkit_should_run_step(context=context) is False:
            reason = record.reason or "skipped by passkit_should_run_step"
        if reason:
            record.status = "skipped"
            record.reason = reason
        else:
            _check_requires(pipeline, step, program)
            _run_step(pm, registry, context)
            previous.append(step.id)
        if progress is not None:
            progress(record)


def _run_step(pm: pluggy.PluginManager, registry: Registry, context: StepContext) -> None:
    program, record = context.program, context.record
    program.stats.clear()
    record.nodes_before = program.node_count()
    context.graph_hash_before = program.graph_hash()
    try:
        claimed = pm.hook.passkit_run_step(context=context)
    except VerificationError as exc:
        if not record.repro:
            raise
        raise VerificationError(f"{exc} (reproducer: {record.repro})") from exc
    except Exception as exc:
        raise PassError(_failure_message(context, exc)) from exc
    changed = context.graphs_changed
    record.changed = changed
    record.claimed_changed = None if claimed is None else bool(claimed)
    record.nodes_after = program.node_count()
    record.stats = dict(program.stats)
    holding = context.facts_after()
    for name in program.facts - holding:
        fact = registry.facts.get(name)
        if fact is not None and fact.discard is not None:
            fact.discard(program)
    program.facts = holding


def _failure_message(context: StepContext, exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    what = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    after = f"after: {', '.join(context.previous)}" if context.previous else "first step"
    repro = f" (reproducer: {context.record.repro})" if context.record.repro else ""
    return f"{context.label} failed{where_it_failed(exc)}: {what} ({after}){repro}"


def _check_requires(pipeline: Pipeline, step: Step, program: Program) -> None:
    missing = sorted(step.pass_.requires - program.facts)
    if missing:
        facts = ", ".join(sorted(program.facts)) or "none"
        raise PipelineError(
            f"{pipeline.where(step)}: requires fact '{missing[0]}', which the program lacks (facts: {facts})"
        )
