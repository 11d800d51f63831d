"""Own "one pass alone": the smallest pipeline that loads with a given pass in it.

Used by ``passkit fuzz --pass`` and ``passkit.testing.fuzz_pass``. Start from a base pipeline:

1. the step: the base's own step for the pass (its options and place kept), else a new step with
   the pass's defaults, put where a base step produces the same facts (a code generator
   replaces the code generator), else just after the earliest point its required facts hold
   (one that takes facts away, such as ``reinplace``, just before the code generator);
2. every other step is left out in turn, last first, and stays out while the steps still load
   as a pipeline file (``passkit.debug.bisect.loads_as_file``: contracts hold, the plan ends
   ``compiled``) and, when the base can train, still makes a joint graph and partitions it.

What is left is the pass and the steps that produce what it and loading need, the rule bisect's
minimal pipeline follows.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

from passkit.core.facts import after
from passkit.debug.bisect import loads_as_file
from passkit.errors import PipelineError

if TYPE_CHECKING:
    from passkit.core.pass_api import Pass
    from passkit.core.registry import Registry
    from passkit.pipeline import Pipeline, Step

__all__ = ["pipeline_alone"]


def pipeline_alone(base: Pipeline, pass_or_id: Pass | str, registry: Registry) -> Pipeline:
    """The smallest pipeline from ``base`` that runs ``pass_or_id`` (a pass, a pass name or a
    step id of ``base``); a one-line ``PipelineError`` when none loads."""
    from passkit.pipeline import Pipeline, Step

    steps = list(base.steps)
    target = next((s for s in steps if isinstance(pass_or_id, str) and pass_or_id in (s.id, s.pass_name)), None)
    if target is None:
        pass_ = registry.get_pass(pass_or_id) if isinstance(pass_or_id, str) else pass_or_id
        target = Step(position=-1, id=pass_.name, pass_=pass_, options=pass_.options(registry=registry), when=None,
                      enabled=True, origin={}, unregistered=not isinstance(pass_or_id, str) and pass_.name not in registry.passes)
        steps = _placed(steps, target, registry)
    steps = [s for s in steps if s.enabled or s is target]
    # A training program needs its joint graph partitioned (the runtime calls a forward and a
    # backward): what the base makes of those, the smaller pipeline makes too.
    training_facts = _produced(base.steps) & {"joint", "partitioned"}
    for step in reversed(list(steps)):
        if step is target:
            continue
        shorter = [s for s in steps if s is not step]
        candidate = _numbered(base, shorter)
        if loads_as_file(candidate, list(candidate.steps), registry) and training_facts <= _produced(shorter):
            steps = shorter
    alone = _numbered(base, steps)
    if not loads_as_file(alone, list(alone.steps), registry):
        raise PipelineError(f"{base.label}: no pipeline made from its steps loads with pass {target.pass_name!r}")
    name = f"{base.name}-{target.id}-alone"
    # Named for what it is: its step numbers are not the base file's.
    return dataclasses.replace(alone, name=name, description=f"{target.id} alone, with what {base.name} needs to load it",
                               source=None, files=())


def _produced(steps: Sequence[Step]) -> set[str]:
    return {fact for step in steps if step.enabled for fact in step.pass_.produces}


def _placed(steps: list[Step], target: Step, registry: Registry) -> list[Step]:
    produces = target.pass_.produces
    for index, step in enumerate(steps):
        if produces and step.pass_.produces == produces:
            return [*steps[:index], target, *steps[index + 1:]]
    if target.pass_.invalidates:
        # It takes facts away (``reinplace``: ``functional``): as late as it can go, before the
        # code generator.
        for index, step in enumerate(steps):
            if "compiled" in step.pass_.produces:
                return [*steps[:index], target, *steps[index:]]
    facts = {"captured"}
    for index, step in enumerate(steps):
        if target.pass_.requires <= facts:
            return [*steps[:index], target, *steps[index:]]
        if step.enabled:
            facts = after(facts, step.pass_, graphs_changed=True, table=registry.facts)
    return [*steps, target]


def _numbered(base: Pipeline, steps: list[Step]) -> Pipeline:
    """``base`` with ``steps``, numbered in order (positions are what the runner and bisect
    count by); a step keeps no location from a file it is no longer at."""
    renumbered = tuple(dataclasses.replace(s, position=i, location="") for i, s in enumerate(steps))
    return dataclasses.replace(base, steps=renumbered)
