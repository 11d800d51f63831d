"""Own the contract of a mounted pipeline file: which Inductor slot each step runs in, and
whether its pass can run there.

A file mounted in stock Inductor (``passkit.inductor_options``) has no stages of its own:
torch's AOT Autograd and Inductor make the graphs, and each step runs in one of Inductor's six
custom-pass slots, on the graph that slot hands over. ``SLOTS`` says what each graph is (its
facts, for training and for inference); ``check_slots`` gives every step its slot (the
``slot`` key, or the pass's facts when only one slot fits: a partitioner goes in
``partition``) and refuses, in one line at load, a step whose pass cannot run where it stands:

- a code generator (Inductor generates the code);
- a pass that requires a fact the slot's graph lacks (earlier steps of the same slot count);
- a pass that adds or removes graph inputs or outputs (it establishes or breaks a structural
  fact: ``functional``, ``joint``, ``partitioned``), which Inductor forbids outside the
  partitioner slot, or that breaks a fact Inductor's later passes rely on;
- in ``partition``, anything but one partitioner.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from passkit.errors import PipelineError
from passkit.core.facts import FINAL_FACT, applies
from passkit.pipeline.schema import SLOT_NAMES

if TYPE_CHECKING:
    from passkit.pipeline.model import Pipeline, Step
    from passkit.core.registry import Registry

__all__ = ["SLOTS", "Slot", "check_slots", "slot_steps"]

# Facts that describe the graphs' inputs and outputs: a pass establishing or breaking one
# reshapes the graph (functionalize adds mutation outputs, joint adds tangents, a partitioner
# splits the graph), which only Inductor's partitioner slot may do.
STRUCTURAL = frozenset({"captured", "functional", "joint", "partitioned", FINAL_FACT})
_AFTER_AOT = frozenset({"captured", "functional", "decomposed"})


@dataclass(frozen=True)
class Slot:
    """One of Inductor's custom-pass slots, and what the graph it hands over holds."""

    name: str
    config_key: str  # the ``torch._inductor.config`` entry
    training: frozenset[str]  # facts of its graph in a training compile
    inference: frozenset[str] | None  # in an inference compile (None: the slot never runs)
    graphs: str  # what the slot sees, for messages and docs


SLOTS: dict[str, Slot] = {
    slot.name: slot
    for slot in (
        Slot("pre_grad", "pre_grad_custom_pass", frozenset({"captured"}), frozenset({"captured"}),
             "Dynamo's torch-level graph, before AOT Autograd"),
        Slot("joint_pre", "joint_custom_pre_pass", _AFTER_AOT | {"joint"}, _AFTER_AOT,
             "the joint graph (an inference graph alone), before Inductor's joint passes"),
        Slot("joint_post", "joint_custom_post_pass", _AFTER_AOT | {"joint"}, _AFTER_AOT,
             "the joint graph (an inference graph alone), after Inductor's joint passes"),
        Slot("partition", "custom_partitioner_fn", _AFTER_AOT | {"joint"}, None,
             "the joint graph, to split into forward and backward"),
        Slot("post_grad_pre", "post_grad_custom_pre_pass", _AFTER_AOT | {"partitioned"}, _AFTER_AOT,
             "the forward and the backward, each alone, before Inductor's post-grad patterns"),
        Slot("post_grad_post", "post_grad_custom_post_pass", _AFTER_AOT | {"partitioned"}, _AFTER_AOT,
             "the forward and the backward, each alone, after Inductor's post-grad patterns"),
    )
}
assert tuple(SLOTS) == SLOT_NAMES


def slot_steps(pipeline: Pipeline) -> dict[str, tuple[Step, ...]]:
    """The enabled steps of a checked mounted pipeline, by slot, in file order; empty slots left out."""
    found: dict[str, list[Step]] = {}
    for step in pipeline.steps:
        if step.enabled and step.slot is not None:
            found.setdefault(step.slot, []).append(step)
    return {name: tuple(found[name]) for name in SLOT_NAMES if name in found}


def check_slots(pipeline: Pipeline, registry: Registry) -> Pipeline:
    """Give each step its slot and check that its pass can run there; return the pipeline
    with every slot filled in.

    Raises:
        PipelineError: one line naming the step, its slot and what to do.
    """
    steps = tuple(_with_slot(pipeline, step) for step in pipeline.steps)
    pipeline = dataclasses.replace(pipeline, steps=steps)
    produced: dict[tuple[str, bool], set[str]] = {}
    partitioner: Step | None = None
    for step in steps:
        slot = SLOTS[step.slot]  # type: ignore[index]
        where = f"{pipeline.where(step)}.slot"
        _refuse_reshaping(where, step, slot)
        if slot.name == "partition":
            if partitioner is not None and step.enabled and partitioner.enabled:
                raise PipelineError(
                    f"{where}: slot 'partition' already holds step {partitioner.id!r}; Inductor takes one partitioner"
                )
            partitioner = step if step.enabled else partitioner
        for training in (True, False):
            facts = slot.training if training else slot.inference
            if facts is None or not applies(enabled=step.enabled, when=step.when, pass_=step.pass_, training=training):
                continue
            holding = facts | produced.setdefault((slot.name, training), set())
            missing = sorted(step.pass_.requires - holding)
            if missing:
                raise PipelineError(f"{where}: {_lacks(missing[0], slot, training, registry)}")
            produced[(slot.name, training)] |= step.pass_.produces
    return pipeline


def _with_slot(pipeline: Pipeline, step: Step) -> Step:
    if step.slot is not None:
        return step
    # The only slot facts decide alone: a partitioner can only split the joint graph.
    if "partitioned" in step.pass_.produces:
        return dataclasses.replace(step, slot="partition", origin={**step.origin, "slot": "<inferred>"})
    raise PipelineError(
        f"{pipeline.where(step)}: no slot; a mounted file runs each step in one of Inductor's slots: "
        f"set slot = one of {', '.join(repr(name) for name in SLOT_NAMES)}"
    )


def _refuse_reshaping(where: str, step: Step, slot: Slot) -> None:
    pass_ = step.pass_
    if FINAL_FACT in pass_.produces:
        raise PipelineError(
            f"{where}: {pass_.name!r} generates code, which Inductor does for a mounted file; remove the step"
        )
    if slot.name == "partition":
        if "partitioned" not in pass_.produces:
            raise PipelineError(
                f"{where}: slot 'partition' takes a partitioner (a pass that produces 'partitioned'), "
                f"and {pass_.name!r} is not one; run it in 'joint_post' or 'post_grad_pre'"
            )
        return
    reshaping = sorted((pass_.produces & STRUCTURAL) - slot.training)
    if reshaping:
        hint = "; a partitioner goes in slot 'partition'" if "partitioned" in reshaping else ""
        raise PipelineError(
            f"{where}: {pass_.name!r} produces {reshaping[0]!r}, which adds or removes graph inputs or "
            f"outputs, and Inductor forbids that in slot {slot.name!r}{hint}"
        )
    broken = sorted(pass_.invalidates & (slot.training | STRUCTURAL))
    if broken:
        raise PipelineError(
            f"{where}: {pass_.name!r} invalidates {broken[0]!r}, which Inductor's own passes after slot "
            f"{slot.name!r} rely on; Inductor does that work itself, so leave the step out"
        )


def _lacks(fact: str, slot: Slot, training: bool, registry: Registry) -> str:
    kind = ("training " if training else "inference ") if slot.training != slot.inference else ""
    facts = slot.training if training else slot.inference
    fits = [s.name for s in SLOTS.values() if fact in s.training and s.name != "partition"]
    hint = f"; slots whose graph holds it: {', '.join(fits)}" if fits else ""
    if not fits and fact not in STRUCTURAL:
        producers = [name for name in registry.producers(fact) if name]
        hint = f"; add a {' or '.join(map(repr, producers))} step before it in this slot" if producers else ""
    return (
        f"requires fact {fact!r}, which the {kind}graph in slot {slot.name!r} lacks "
        f"(it holds: {', '.join(sorted(facts or ()))}){hint}"
    )
