"""Own bisection: find the first step that changes numerics or crashes, and a minimal pipeline.

Bisection is a plugin of the step loop, not a special case in it: ``StepFilter`` implements
``passkit_should_run_step`` and skips every step past a limit (LLVM's ``-opt-bisect-limit``)
and any steps it is told to leave out. Each trial runs the pipeline, so filtered, on a fresh
snapshot of the captured program and compares what the program then computes with the captured
program (``passkit.evaluate.Reference``, the same comparison as ``verify = "numerics"``).

1. The whole pipeline runs once; if it agrees with the capture, every step is good.
2. A binary search over how many of the applicable steps run finds the first bad one.
3. Every earlier step that no later step needs a fact from is left out in turn, and stays out
   when the failure still shows with the bad step and the steps before it still agree with the
   capture: what remains is the minimal pipeline. Trials are cached by the steps they run.
4. The minimal pipeline is written as a file, read back and run once more with ``verify`` on,
   which confirms it and writes a reproducer (``passkit.debug.repro``).

Extension point, not implemented yet: inside a ``rewrite`` step the search should continue over
pattern applications. That needs the pattern engine (the pattern-rewrite issue) to ask a
should-apply hook before each application, with a running application count; a
``StepFilter``-like plugin would then limit applications exactly as it limits steps here, and
``Bisection.pattern_application`` would name the application. Until then it stays None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from passkit.debug.pipeline_file import pipeline_toml
from passkit.debug.repro import failure_kind
from passkit.debug.snapshot import snapshot_program
from passkit.errors import PassError, PipelineError, VerificationError
from passkit.facts import after, applies
from passkit.hookspecs import hookimpl
from passkit.runner import run_pipeline

if TYPE_CHECKING:
    import pluggy

    from passkit.evaluate import Reference
    from passkit.hookspecs import StepContext
    from passkit.pipeline import Pipeline, Step
    from passkit.program import Program
    from passkit.registry import Registry

__all__ = ["StepFilter", "Outcome", "Bisection", "trial", "bisect_program", "write_minimal", "confirm"]


class StepFilter:
    """A ``passkit_should_run_step`` plugin: run no step at or past ``limit``, none in ``leave_out``.

    It also remembers the last step it was asked about, so a caller can read that step's record
    (for example the reproducer a failing step wrote).
    """

    def __init__(self, limit: int, leave_out: frozenset[int] = frozenset()) -> None:
        self.limit = limit
        self.leave_out = leave_out
        self.last: StepContext | None = None

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

    @property
    def bad(self) -> bool:
        return self.kind is not None and self.kind != "contract"


@dataclass
class Bisection:
    """The result for one program: the first bad step (None when all are good) and the evidence."""

    graph: str
    applicable: list[int]
    first_bad: Step | None = None
    outcome: Outcome = Outcome(None)
    minimal: list[Step] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)
    pattern_application: str | None = None  # see the module docstring: needs the pattern engine


Progress = Callable[[str], None]


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
        run_pipeline(pipeline, program, pm=pm, registry=registry)
    except PipelineError as exc:
        return Outcome("contract", str(exc))
    except (PassError, VerificationError) as exc:
        cause = exc.__cause__ if isinstance(exc, PassError) and exc.__cause__ is not None else exc
        last = step_filter.last
        return Outcome(failure_kind(cause), str(exc).splitlines()[0], last.record.repro if last is not None else "")
    finally:
        pm.unregister(step_filter)
    try:
        difference = reference.compare(program)
    except Exception as exc:  # noqa: BLE001 - a program that cannot even run is bad
        return Outcome("crash", f"running the program failed: {type(exc).__name__}: {exc}")
    return Outcome(None) if difference is None else Outcome("numerics", f"changed numerics: {difference}")


def _needed(pipeline: Pipeline, program: Program, kept: list[int], registry: Registry) -> bool:
    """Whether the steps at ``kept`` positions, in order, have every fact they require."""
    facts = set(program.facts)
    for position in kept:
        pass_ = pipeline.steps[position].pass_
        if pass_.requires - facts:
            return False
        facts = after(facts, pass_, graphs_changed=True, table=registry.facts)
    return True


def bisect_program(
    captured: Program,
    reference: Reference,
    pipeline: Pipeline,
    *,
    pm: pluggy.PluginManager,
    registry: Registry,
    graph: str = "graph 1",
    progress: Progress | None = None,
) -> Bisection:
    """Find the first step of ``pipeline`` that makes ``captured`` deviate or fail, and the
    smallest set of earlier steps that still shows it."""
    say = progress or (lambda text: None)
    # Trials judge numerics themselves; facts stay checked so a fact-breaking step is named too.
    quiet = pipeline.with_settings(
        verify="off" if pipeline.settings.verify == "off" else "facts", dump="off", repro_dir="", report=""
    )
    applicable = [
        step.position
        for step in pipeline.steps
        if applies(enabled=step.enabled, when=step.when, pass_=step.pass_, training=captured.training)
    ]
    result = Bisection(graph=graph, applicable=applicable)

    seen: dict[tuple[int, ...], Outcome] = {(): Outcome(None)}  # no steps: the capture itself

    def run(count: int, leave_out: frozenset[int] = frozenset()) -> Outcome:
        numbers = [p + 1 for p in applicable[:count] if p not in leave_out]
        if tuple(numbers) in seen:
            return seen[tuple(numbers)]
        limit = applicable[count - 1] + 1 if count else 0
        outcome = trial(captured, reference, quiet, StepFilter(limit, leave_out), pm=pm, registry=registry)
        say(f"bisect: {graph}: steps {_ranges(numbers)}: {outcome.kind or 'good'}")
        result.trials.append({"steps": numbers, "outcome": outcome.kind or "good", "message": outcome.message})
        seen[tuple(numbers)] = outcome
        return outcome

    last = run(len(applicable))
    if not last.bad:
        return result
    good, bad = 0, len(applicable)
    while bad - good > 1:
        middle = (good + bad) // 2
        outcome = run(middle)
        if outcome.bad:
            bad, last = middle, outcome
        else:
            good = middle
    first_bad = applicable[bad - 1]
    result.first_bad = pipeline.steps[first_bad]
    result.outcome = last
    left_out: set[int] = set()
    for position in reversed(applicable[: bad - 1]):
        kept = [p for p in applicable[:bad] if p not in left_out and p != position]
        if not _needed(pipeline, captured, kept, registry):
            continue
        candidate = frozenset(left_out | {position})
        # Out for good only if the bad step still fails and the steps before it are still good:
        # else the difference would come from somewhere else than the bad step.
        if run(bad, candidate).kind == last.kind and not run(bad - 1, candidate).bad:
            left_out.add(position)
    prefix = [pipeline.steps[p] for p in applicable[:bad] if p not in left_out]
    result.minimal = _with_tail(pipeline, prefix, [pipeline.steps[p] for p in applicable[bad:]], registry)
    return result


def _valid(pipeline: Pipeline, steps: list[Step], registry: Registry) -> bool:
    from passkit.pipeline.contracts import check_contracts

    candidate = dataclasses.replace(pipeline, steps=tuple(steps))
    try:
        check_contracts(candidate, registry, training=candidate.can_train)
    except PipelineError:
        return False
    return True


def _with_tail(pipeline: Pipeline, prefix: list[Step], after_bad: list[Step], registry: Registry) -> list[Step]:
    """``prefix`` plus as few of the steps after the bad one as loading a pipeline file needs
    (it must end with ``compiled``). They never run: with ``verify`` on, the bad step fails first."""
    tail = list(after_bad)
    if not _valid(pipeline, prefix + tail, registry):
        return prefix + tail
    for step in list(tail):
        shorter = [s for s in tail if s is not step]
        if _valid(pipeline, prefix + shorter, registry):
            tail = shorter
    return prefix + tail


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    parts: list[str] = []
    for number in numbers:
        if parts and number == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{number}"
        else:
            parts.append(str(number))
    return ", ".join(parts)


def write_minimal(pipeline: Pipeline, bisection: Bisection, path: Path) -> Path:
    """Write the minimal pipeline: the steps that still show the failure, with ``verify =
    "numerics"`` so that running it names the bad step, also when the step itself does not raise
    but leaves a program that changes numerics or fails to run."""
    assert bisection.first_bad is not None
    kind = bisection.outcome.kind
    first = bisection.first_bad
    comment = (
        f"Minimal pipeline written by passkit bisect: {pipeline.where(first)} is the first bad step ({kind}).\n"
        f"Run it with `passkit run {path.name} --model ...`; it fails at its last step."
    )
    text = pipeline_toml(
        pipeline,
        steps=bisection.minimal,
        name=f"{pipeline.name}-minimal",
        description=f"the steps up to {first.id} that still show the failure",
        comment=comment,
        verify="numerics",
    )
    path.write_text(text, encoding="utf-8")
    return path


def confirm(
    path: Path, captured: Program, reference: Reference, *, pm: pluggy.PluginManager, registry: Registry,
    expected: str | None,
) -> Outcome:
    """Load the minimal pipeline file and run it once, reproducers on; the outcome says whether
    it fails the same way (and names the reproducer it wrote)."""
    from passkit.pipeline import load_pipeline

    minimal = load_pipeline(path, registry=registry)
    program = snapshot_program(captured)
    observer = StepFilter(len(minimal.steps))
    pm.register(observer, name="passkit-bisect")
    try:
        run_pipeline(minimal, program, pm=pm, registry=registry, reference=reference)
    except (PassError, VerificationError) as exc:
        cause = exc.__cause__ if isinstance(exc, PassError) and exc.__cause__ is not None else exc
        repro = observer.last.record.repro if observer.last is not None else ""
        return Outcome(failure_kind(cause), str(exc).splitlines()[0], repro)
    finally:
        pm.unregister(observer)
    return Outcome(None)

