"""Own one bisection trial: the pipeline run with some steps (and rewrites) filtered out, on a
fresh snapshot of the captured program, and what the result showed against the capture.

``StepFilter`` is the plugin of the step loop that filters (``passkit_should_run_step`` and
``passkit_should_apply``); ``Outcome`` is a trial's verdict. ``passkit.debug.bisect`` searches
with trials, ``passkit.debug.bisect_patterns`` searches inside one bad step with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from passkit.artifacts.reproducer import failure_kind
from passkit.artifacts.snapshot import snapshot_program
from passkit.core.hookspecs import hookimpl
from passkit.core.runner import run_pipeline
from passkit.errors import PassError, PipelineError, VerificationError
from passkit.verify.compare import tolerance_for

if TYPE_CHECKING:
    import pluggy

    from passkit.core.hookspecs import Application, StepContext
    from passkit.core.program import Program
    from passkit.core.registry import Registry
    from passkit.pipeline import Pipeline
    from passkit.verify.evaluate import Reference

__all__ = ["StepFilter", "Outcome", "trial"]


class StepFilter:
    """A ``passkit_should_run_step`` plugin: run no step at or past ``limit``, none in ``leave_out``.

    It also remembers the last step it was asked about, so a caller can read that step's record
    (for example the reproducer a failing step wrote). As a ``passkit_should_apply`` plugin it
    records the applications the last step in range (position ``limit - 1``) asks about, and
    vetoes those past ``application_limit``.
    """

    def __init__(self, limit: int, leave_out: frozenset[int] = frozenset(), *, application_limit: int | None = None) -> None:
        self.limit = limit
        self.leave_out = leave_out
        self.application_limit = application_limit
        self.last: StepContext | None = None
        self.asked: list[Application] = []

    @hookimpl
    def passkit_should_apply(self, context: StepContext, application: Application) -> bool | None:
        if context.step.position != self.limit - 1:
            return None
        self.asked.append(application)
        if self.application_limit is not None and application.index > self.application_limit:
            return False
        return None

    @hookimpl
    def passkit_should_run_step(self, context: StepContext) -> bool | None:
        self.last = context
        position = context.step.position
        if position >= self.limit:
            context.record.reason = f"bisect: past step {self.limit}"
            return False
        if position in self.leave_out:
            context.record.reason = "bisect: left out"
            return False
        return None


@dataclass(frozen=True)
class Outcome:
    """What one trial showed: ``kind`` is None when the program still agrees with the capture."""

    kind: str | None  # None, "crash", "fact", "numerics" or "contract" (a needed fact is missing)
    message: str = ""
    repro: str = ""
    applications: tuple[Application, ...] = ()  # what the last step run asked about, in order

    @property
    def bad(self) -> bool:
        return self.kind is not None and self.kind != "contract"


def trial(
    captured: Program,
    reference: Reference,
    pipeline: Pipeline,
    step_filter: StepFilter,
    *,
    pm: pluggy.PluginManager,
    registry: Registry,
) -> Outcome:
    """Run ``pipeline`` filtered by ``step_filter`` on a copy of ``captured``; judge the result."""
    program = snapshot_program(captured)
    pm.register(step_filter, name="passkit-bisect")
    try:
        report = run_pipeline(pipeline, program, pm=pm, registry=registry)
    except PipelineError as exc:
        return Outcome("contract", str(exc))
    except (PassError, VerificationError) as exc:
        cause = exc.__cause__ if isinstance(exc, PassError) and exc.__cause__ is not None else exc
        last = step_filter.last
        repro = last.record.repro if last is not None else ""
        return Outcome(failure_kind(cause), str(exc).splitlines()[0], repro, tuple(step_filter.asked))
    finally:
        pm.unregister(step_filter)
    asked = tuple(step_filter.asked)
    ran = {record.position for record in report.records if record.status == "ran"}
    tolerance = tolerance_for(pipeline.settings, (step for step in pipeline.steps if step.position in ran))
    try:
        difference = reference.compare(program, tolerance)
    except Exception as exc:  # noqa: BLE001 - a program that cannot even run is bad
        return Outcome("crash", f"running the program failed: {type(exc).__name__}: {exc}", applications=asked)
    if difference is None:
        return Outcome(None, applications=asked)
    return Outcome("numerics", f"changed numerics: {difference}", applications=asked)
