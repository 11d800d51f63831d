"""Own bisecting a mounted pipeline file inside stock ``torch.compile`` (``passkit bisect --inductor``).

Each trial compiles the user's model with stock ``torch.compile`` and the file mounted in
Inductor's slots (``passkit.frontends.inductor_slots``), Inductor's and AOT Autograd's caches off, runs
one training step (or one call under ``no_grad`` when nothing needs gradients) and compares
the outputs and gradients with eager's (``passkit.verify.compare``, the pipeline's tolerance loosened
by the passes' declared ones). A ``StepFilter`` (``passkit.debug.bisect``) limits the steps that
run, as in any bisection: a binary search over how many of the file's steps run names the
first bad step, then one over how many of its rewrites run names the first bad application
(``passkit.debug.bisect_patterns``). Applications are counted across every graph the step runs
on, in compile order (the forward before the backward), so the count is the same each trial.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch

from passkit import _torch
from passkit.verify.compare import compare_values, same_random_draws, tolerance_for
from passkit.debug.bisect import shortest_bad_prefix
from passkit.debug.trial import Outcome, StepFilter
from passkit.debug.bisect_patterns import bisect_applications
from passkit.artifacts.reproducer import failure_kind
from passkit.core.hookspecs import hookimpl

if TYPE_CHECKING:
    import pluggy

    from passkit.core.hookspecs import Application, StepContext
    from passkit.frontends.check import ModelExample
    from passkit.pipeline import Pipeline, Step
    from passkit.core.registry import Registry

__all__ = ["MountedBisection", "bisect_mounted"]


@dataclass
class MountedBisection:
    """The first bad step of a mounted file on one model (None when every step is good)."""

    steps: list[int]  # positions of the steps that run, in file order
    first_bad: Step | None = None
    outcome: Outcome = Outcome(None)
    pattern_application: Application | None = None
    applications: int = 0  # how many the bad step asked about, over all its graphs
    application_number: int = 0  # the first bad one's place among them (1-based)
    trials: list[dict[str, Any]] = field(default_factory=list)


class _CountingFilter(StepFilter):
    """``StepFilter`` whose application limit counts the last step's asks across all its graphs."""

    @hookimpl
    def passkit_should_apply(self, context: StepContext, application: Application) -> bool | None:
        if context.step.position != self.limit - 1:
            return None
        self.asked.append(application)
        if self.application_limit is not None and len(self.asked) > self.application_limit:
            return False
        return None


def _step(model: torch.nn.Module, example: ModelExample, training: bool) -> list[Any]:
    from passkit.frontends.check import _loss

    with torch.set_grad_enabled(training), same_random_draws():
        out = example(model)
        if training:
            _loss(out).backward()
    leaves = list(_torch.pytree.tree_leaves(out))
    if not training:
        return leaves
    return leaves + [p.grad for p in model.parameters() if p.requires_grad]


def _passkit_cause(exc: BaseException) -> BaseException:
    """The passkit error inside Dynamo's and Inductor's wrappers, else ``exc`` itself."""
    from passkit.errors import PasskitError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, PasskitError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def bisect_mounted(
    pipeline: Pipeline, spec: str, *, pm: pluggy.PluginManager, registry: Registry,
    progress: Callable[[str], None] | None = None,
) -> MountedBisection:
    """Find the first step of mounted ``pipeline`` that makes the model from ``spec`` deviate
    from eager or fail inside ``torch.compile``, and the first bad rewrite inside it."""
    from passkit.frontends.check import build_model
    from passkit.frontends.inductor_slots import MountedFile
    from passkit.pipeline.slots import slot_steps

    say = progress or (lambda text: None)
    example = build_model(spec)
    module = example.module
    training = torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())
    expected = _step(copy.deepcopy(module), example, training)
    steps = sorted(step.position for group in slot_steps(pipeline).values() for step in group)
    result = MountedBisection(steps=steps)
    quiet = pipeline.with_settings(dump="off", repro_dir="", report="")

    def run(count: int, applications: int | None = None) -> Outcome:
        limit = steps[count - 1] + 1 if count else 0
        step_filter = _CountingFilter(limit, application_limit=applications)
        pm.register(step_filter, name="passkit-bisect")
        try:
            torch.compiler.reset()
            model = copy.deepcopy(module)
            with _torch.inductor_caches_off():
                compiled = torch.compile(model, options=MountedFile(quiet, pm, registry).options())
                actual = _step(compiled, example, training)
            tolerance = tolerance_for(pipeline.settings, [pipeline.steps[p] for p in steps[:count]])
            comparison = compare_values(expected, actual, "outputs and grads", tolerance)
            first = comparison.mismatches[0] if comparison.mismatches else None
            outcome = (Outcome(None, applications=tuple(step_filter.asked)) if first is None else
                       Outcome("numerics", f"changed numerics: {first} ({first.tolerance})",
                               applications=tuple(step_filter.asked)))
        except Exception as raised:  # noqa: BLE001 - a step that crashes the compile is a bad step
            exc = _passkit_cause(raised)
            lines = str(exc).strip().splitlines()
            outcome = Outcome(failure_kind(exc), lines[0] if lines else type(exc).__name__,
                              applications=tuple(step_filter.asked))
        finally:
            pm.unregister(step_filter)
            torch.compiler.reset()
        within = "" if applications is None else f", applications 1-{applications}"
        say(f"bisect --inductor: steps 1-{count} of {len(steps)}{within}: {outcome.kind or 'good'}")
        result.trials.append({"steps": [p + 1 for p in steps[:count]], "applications": applications,
                              "outcome": outcome.kind or "good", "message": outcome.message})
        return outcome

    last = run(len(steps))
    if not last.bad:
        return result
    bad, last = shortest_bad_prefix(run, len(steps), last)
    result.first_bad = pipeline.steps[steps[bad - 1]]
    result.outcome = last
    result.applications = len(last.applications)
    result.pattern_application = bisect_applications(last, lambda n: run(bad, applications=n))
    if result.pattern_application is not None:
        result.application_number = last.applications.index(result.pattern_application) + 1
    return result
