"""Own bisection: find the first step that changes numerics or crashes, and a minimal pipeline.

Bisection is a plugin of the step loop, not a special case in it: ``StepFilter`` implements
``passkit_should_run_step`` and skips every step past a limit (LLVM's ``-opt-bisect-limit``)
and any steps it is told to leave out. Each trial runs the pipeline, so filtered, on a fresh
snapshot of the captured program and compares what the program then computes with the captured
program (``passkit.verify.evaluate.Reference``, the same comparison as ``verify = "numerics"``, within
the tolerance the steps that ran declare: ``passkit.verify.compare.tolerance_for``).

1. The whole pipeline runs once; if it agrees with the capture, every step is good.
2. A binary search over how many of the applicable steps run finds the first bad one.
3. Every earlier step that no later step needs a fact from is left out in turn, and stays out
   when the failure still shows with the bad step and the steps before it still agree with the
   capture: what remains is the minimal pipeline. Trials are cached by the steps they run.
4. The minimal pipeline is written as a file, read back and run once more with ``verify`` on,
   which confirms it and writes a reproducer (``passkit.artifacts.reproducer``).

5. When the bad step made single rewrites it asked about (``passkit_should_apply``: the
   ``rewrite`` pass asks before each pattern application), the search continues over them:
   ``StepFilter`` also vetoes every application of the last step it runs past
   ``application_limit``, and a binary search over that limit names the first bad application
   (``passkit.debug.bisect_patterns``). The minimal pipeline then narrows the step to that
   application's pattern when that still shows the failure.

``start`` bisects a program that earlier steps already made (a reproducer's): steps before it
are left out of every trial, and the minimal pipeline keeps them first (they describe the
program) while ``confirm`` skips them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from passkit.debug.bisect_patterns import bisect_applications, narrowed
from passkit.artifacts.pipeline_file import pipeline_toml
from passkit.artifacts.reproducer import failure_kind
from passkit.artifacts.snapshot import snapshot_program
from passkit.errors import PassError, PipelineError, VerificationError
from passkit.core.facts import after, applies
from passkit.core.runner import run_pipeline
from passkit.debug.trial import Outcome, StepFilter, trial

if TYPE_CHECKING:
    import pluggy

    from passkit.verify.evaluate import Reference
    from passkit.core.hookspecs import Application
    from passkit.pipeline import Pipeline, Step
    from passkit.core.program import Program
    from passkit.core.registry import Registry

__all__ = ["Bisection", "bisect_program", "shortest_bad_prefix", "write_minimal", "confirm", "loads_as_file", "with_needed_tail"]


@dataclass
class Bisection:
    """The result for one program: the first bad step (None when all are good) and the evidence."""

    graph: str
    applicable: list[int]
    first_bad: Step | None = None
    outcome: Outcome = Outcome(None)
    minimal: list[Step] = field(default_factory=list)
    trials: list[dict[str, Any]] = field(default_factory=list)
    pattern_application: Application | None = None  # the first bad one inside ``first_bad``
    applications: int = 0  # how many the bad step asked about
    start: int = 0  # steps before this position had already run (a reproducer's program)


Progress = Callable[[str], None]


def _needed(pipeline: Pipeline, program: Program, kept: list[int], registry: Registry) -> bool:
    """Whether the steps at ``kept`` positions, in order, have every fact they require."""
    facts = set(program.facts)
    for position in kept:
        pass_ = pipeline.steps[position].pass_
        if pass_.requires - facts:
            return False
        facts = after(facts, pass_, graphs_changed=True, table=registry.facts)
    return True


def shortest_bad_prefix(run: Callable[[int], Any], count: int, last: Any) -> tuple[int, Any]:
    """The fewest leading steps (1..``count``) whose run is bad, and that run's outcome, by
    binary search; ``last`` is the outcome of all ``count``, already known to be bad."""
    good, bad = 0, count
    while bad - good > 1:
        middle = (good + bad) // 2
        outcome = run(middle)
        if outcome.bad:
            bad, last = middle, outcome
        else:
            good = middle
    return bad, last


def bisect_program(
    captured: Program,
    reference: Reference,
    pipeline: Pipeline,
    *,
    pm: pluggy.PluginManager,
    registry: Registry,
    graph: str = "graph 1",
    progress: Progress | None = None,
    start: int = 0,
) -> Bisection:
    """Find the first step of ``pipeline`` that makes ``captured`` deviate or fail (and the
    first bad application inside it), and the smallest set of earlier steps that still shows it.
    ``start``: the steps before this position already ran on ``captured``."""
    say = progress or (lambda text: None)
    # Trials judge numerics themselves; facts stay checked so a fact-breaking step is named too.
    quiet = pipeline.with_settings(
        verify="off" if pipeline.settings.verify == "off" else "facts", dump="off", repro_dir="", report=""
    )
    every = [
        step.position
        for step in pipeline.steps
        if applies(enabled=step.enabled, when=step.when, pass_=step.pass_, training=captured.training)
    ]
    applicable = [p for p in every if p >= start]
    already = frozenset(p for p in every if p < start)
    result = Bisection(graph=graph, applicable=applicable, start=start)

    seen: dict[tuple[Any, ...], Outcome] = {(): Outcome(None)}  # no steps: the capture itself

    def run(count: int, leave_out: frozenset[int] = frozenset(), *, applications: int | None = None,
            steps: Pipeline | None = None) -> Outcome:
        numbers = [p + 1 for p in applicable[:count] if p not in leave_out]
        key = (*numbers, "applications", applications) if applications is not None else tuple(numbers)
        if steps is None and key in seen:
            return seen[key]
        limit = applicable[count - 1] + 1 if count else 0
        step_filter = StepFilter(limit, leave_out | already, application_limit=applications)
        outcome = trial(captured, reference, steps or quiet, step_filter, pm=pm, registry=registry)
        within = "" if applications is None else (
            f", applications 1-{applications} of step {numbers[-1]}" if applications else f", no applications of step {numbers[-1]}"
        )
        narrowed_to = " (narrowed)" if steps is not None else ""
        say(f"bisect: {graph}: steps {_ranges(numbers)}{within}{narrowed_to}: {outcome.kind or 'good'}")
        entry: dict[str, Any] = {"steps": numbers}
        if applications is not None:
            entry["applications"] = applications
        if steps is not None:
            entry["narrowed"] = True
        result.trials.append({**entry, "outcome": outcome.kind or "good", "message": outcome.message})
        if steps is None:
            seen[key] = outcome
        return outcome

    last = run(len(applicable))
    if not last.bad:
        return result
    bad, last = shortest_bad_prefix(run, len(applicable), last)
    first_bad = applicable[bad - 1]
    result.first_bad = pipeline.steps[first_bad]
    result.outcome = last
    result.applications = len(last.applications)
    result.pattern_application = bisect_applications(last, lambda n: run(bad, applications=n))
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
    if result.pattern_application is not None:
        out = frozenset(left_out)
        for narrower in narrowed(result.first_bad, result.pattern_application, registry):
            candidate = dataclasses.replace(quiet, steps=tuple(narrower if s.position == first_bad else s for s in quiet.steps))
            if run(bad, out, steps=candidate).kind == last.kind:
                prefix[-1] = narrower
                break
    before = [pipeline.steps[p] for p in sorted(already)]
    tail = [pipeline.steps[p] for p in applicable[bad:]]
    minimal = with_needed_tail(pipeline, prefix, tail, registry, before)
    # A step left out before the bad one can be what a step after it needs for the file to load
    # (functionalize before a decompose that never runs): give such steps back, earliest first.
    for position in sorted(left_out):
        if loads_as_file(pipeline, before + minimal, registry):
            break
        prefix = _restored(pipeline, prefix, pipeline.steps[position])
        minimal = with_needed_tail(pipeline, prefix, tail, registry, before)
    result.minimal = before + minimal
    return result


def _restored(pipeline: Pipeline, prefix: list[Step], step: Step) -> list[Step]:
    """``prefix`` with ``step`` back in its place in the pipeline's order."""
    return sorted([*prefix, step], key=lambda s: s.position)


def loads_as_file(pipeline: Pipeline, steps: list[Step], registry: Registry) -> bool:
    """Whether ``steps`` load as a pipeline file (contracts, ending in ``compiled``, or for an
    export pipeline in ``functional``)."""
    from passkit.pipeline.contracts import check_contracts
    from passkit.pipeline.exports import PROGRAM_KINDS, check_export

    candidate = dataclasses.replace(pipeline, steps=tuple(steps))
    try:
        if candidate.kind in PROGRAM_KINDS:
            check_export(candidate, registry)
        else:
            check_contracts(candidate, registry, training=candidate.can_train)
    except PipelineError:
        return False
    return True


def with_needed_tail(
    pipeline: Pipeline, prefix: list[Step], after_bad: list[Step], registry: Registry, before: list[Step] | None = None
) -> list[Step]:
    """``prefix`` plus as few of the steps after the bad one as loading a pipeline file needs
    (``loads_as_file``). They never run: with ``verify`` on, the bad step fails first.
    ``before`` are steps that already ran (a reproducer's) and come first in the file."""
    head = list(before or [])
    tail = list(after_bad)
    if not loads_as_file(pipeline, head + prefix + tail, registry):
        return prefix + tail
    for step in list(tail):
        shorter = [s for s in tail if s is not step]
        if loads_as_file(pipeline, head + prefix + shorter, registry):
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


def write_minimal(
    pipeline: Pipeline, bisection: Bisection, path: Path, *, model: str | None = None, plugins: Sequence[str] = ()
) -> Path:
    """Write the minimal pipeline: the steps that still show the failure, with ``verify =
    "numerics"`` so that running it names the bad step, also when the step itself does not raise
    but leaves a program that changes numerics or fails to run. Its comment gives the command
    that runs it: ``model`` (else ``--model ...``) and the ``--plugin`` modules the bisection
    was given, without which its passes are unknown."""
    assert bisection.first_bad is not None
    kind = bisection.outcome.kind
    first = bisection.first_bad
    comment = f"Minimal pipeline written by passkit bisect: {pipeline.where(first)} is the first bad step ({kind}).\n"
    if bisection.pattern_application is not None:
        comment += f"First bad application in it: {bisection.pattern_application.describe()}.\n"
    if bisection.start:
        comment += f"Its first {_already_run(bisection)} step(s) had already run on the reproducer's program.\n"
    options = "".join(f" --plugin {module}" for module in plugins)
    comment += f"Run it with `passkit run {path.name} --model {model or '...'}{options}`; it fails at its last step."
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


def _already_run(bisection: Bisection) -> int:
    """How many of the minimal pipeline's first steps had already run on the bisected program."""
    return sum(1 for step in bisection.minimal if step.position < bisection.start)


def confirm(
    path: Path, captured: Program, reference: Reference, *, pm: pluggy.PluginManager, registry: Registry,
    expected: str | None, bisection: Bisection | None = None,
) -> Outcome:
    """Load the minimal pipeline file and run it once, reproducers on; the outcome says whether
    it fails the same way (and names the reproducer it wrote). Steps that had already run on
    ``captured`` (``bisection.start``) are skipped."""
    from passkit.pipeline import load_pipeline

    minimal = load_pipeline(path, registry=registry)
    program = snapshot_program(captured)
    skip = _already_run(bisection) if bisection is not None else 0
    observer = StepFilter(len(minimal.steps), frozenset(range(skip)))
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

