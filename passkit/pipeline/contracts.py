"""Own the fact-contract check: does each step find the facts it requires, in order?

Facts start as ``passkit.core.facts.INITIAL_FACTS``. Which steps apply and which facts hold after
each are ``passkit.core.facts``' rules (``applies``, ``after``), the same ones the runner follows.
A compiling plan must end with ``compiled`` (an export plan's end is
``passkit.pipeline.exports``').
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from passkit.errors import PipelineError
from passkit.core.facts import FINAL_FACT, INITIAL_FACTS, after, applies

if TYPE_CHECKING:
    from passkit.core.pass_api import Pass
    from passkit.pipeline.model import Pipeline, Step
    from passkit.core.registry import Registry

__all__ = ["check_contracts", "plan_facts", "step_applies"]

PREFERRED_CODEGEN = "codegen.python"


def step_applies(step: Step, pass_: Pass, *, training: bool) -> bool:
    """Whether ``step`` runs in a training (or inference) plan (``passkit.core.facts.applies``)."""
    return applies(enabled=step.enabled, when=step.when, pass_=pass_, training=training)


def _why_skipped(step: Step, pass_: Pass) -> str:
    if not step.enabled:
        return f"step {step.id!r} is disabled (by {step.origin.get('enabled', '?')})"
    if step.when is not None:
        return f'step {step.id!r} has when = "{step.when}"'
    return f"step {step.id!r} runs only for training"


def _add_hint(fact: str, registry: Registry) -> str:
    producers = registry.producers(fact)
    if not producers:
        return "; no registered pass produces it"
    return f"; add a {' or '.join(repr(name) for name in producers)} step before it"


def check_contracts(pipeline: Pipeline, registry: Registry, *, training: bool) -> None:
    """Raise ``PipelineError`` at the first step whose required facts are not established, or
    when the plan does not end with ``compiled``.

    The message names the step, its position in its file, the missing fact and what would
    produce it.
    """
    facts = plan_facts(pipeline, registry, training=training)
    if FINAL_FACT not in facts:
        passes = [step.pass_ for step in pipeline.steps]
        plan_note = " for inference" if not training and pipeline.can_train else ""
        raise PipelineError(
            f"{pipeline.label}: no step produces fact {FINAL_FACT!r}{plan_note}"
            + _final_hint(pipeline, passes, registry, training)
        )


def plan_facts(pipeline: Pipeline, registry: Registry, *, training: bool) -> set[str]:
    """The facts the plan ends with; ``PipelineError`` at the first step whose required facts
    are not established then (see ``check_contracts``)."""
    passes = [step.pass_ for step in pipeline.steps]
    # Only say which plan failed when the pipeline has two.
    plan_note = " for inference" if not training and pipeline.can_train else ""
    facts = set(INITIAL_FACTS)
    invalidated_by: dict[str, str] = {}
    for position, (step, pass_) in enumerate(zip(pipeline.steps, passes, strict=True)):
        if not step_applies(step, pass_, training=training):
            continue
        missing = sorted(pass_.requires - facts)
        if missing:
            fact = missing[0]
            raise PipelineError(
                f"{pipeline.where(step)}: requires fact {fact!r}, "
                + _explain_missing(pipeline, passes, position, fact, registry, training, plan_note, invalidated_by)
            )
        facts = after(facts, pass_, graphs_changed=False, table=registry.facts)
        for fact in pass_.produces:
            invalidated_by.pop(fact, None)
        for fact in pass_.invalidates:
            invalidated_by[fact] = step.id
    return facts


def _explain_missing(
    pipeline: Pipeline,
    passes: list[Pass],
    position: int,
    fact: str,
    registry: Registry,
    training: bool,
    plan_note: str,
    invalidated_by: dict[str, str],
) -> str:
    if fact in invalidated_by:
        return f"which the earlier step {invalidated_by[fact]!r} invalidates"
    text = f"which no earlier step produces{plan_note}"
    steps = pipeline.steps
    for earlier, pass_ in zip(steps[:position], passes[:position], strict=True):
        if fact in pass_.produces and not step_applies(earlier, pass_, training=training):
            text += f" ({_why_skipped(earlier, pass_)})"
            if not training and earlier.enabled:
                return text + '; set when = "training" on this step'
            return text
    return text + _add_hint(fact, registry)


def _final_hint(pipeline: Pipeline, passes: list[Pass], registry: Registry, training: bool) -> str:
    for step, pass_ in zip(pipeline.steps, passes, strict=True):
        if FINAL_FACT in pass_.produces and not step_applies(step, pass_, training=training):
            return f" ({_why_skipped(step, pass_)})"
    producers = registry.producers(FINAL_FACT)
    if not producers:
        return "; no registered pass produces it"
    example = PREFERRED_CODEGEN if PREFERRED_CODEGEN in producers else producers[0]
    return f"; end the pipeline with a codegen step such as {example!r}"
