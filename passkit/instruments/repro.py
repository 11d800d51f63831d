"""Own crash reproducers: a wrapper hookimpl that writes a replayable folder for a failing step.

Unless ``settings.repro_dir`` is ``""``, the program is snapshotted once, before the first step
that runs (``passkit.artifacts.snapshot``). When a step raises, breaks a fact or changes numerics,
the program as it was before that step is rebuilt by running the steps before it again on the
snapshot, ``passkit.artifacts.reproducer.write_reproducer`` writes the folder (under ``repro_dir``, else
``$PASSKIT_REPRO_DIR``, else the system temp directory: ``passkit.artifacts.reproducer.repro_root``),
``record.repro`` names it and the runner's one-line error ends with ``(reproducer: <folder>)``.
A run that does not fail pays for one snapshot. The rebuilt graphs are compared with the
failing run's (by hash); a difference (a step that is not deterministic) is recorded in the
manifest. ``repro_dir = ""`` turns all this off. Registered after ``verify``, it wraps it, so
verification failures are caught too. Writing a reproducer never hides the step's own error: if
writing fails, the record says why instead.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Generator

from passkit.core.facts import after
from passkit.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext
    from passkit.core.program import Program

__all__ = ["passkit_run_step"]

# id(program) -> the program as it was before its first step; dropped with the program.
_first_state: dict[int, Program] = {}


@hookimpl(wrapper=True)
def passkit_run_step(context: StepContext) -> Generator[None, bool | None, bool | None]:
    """Snapshot the program before its first step; write a reproducer if a step fails."""
    if context.pipeline.settings.repro_dir == "":
        return (yield)
    from passkit.artifacts.reproducer import write_reproducer
    from passkit.artifacts.snapshot import snapshot_program

    program = context.program
    if not context.previous:
        if id(program) not in _first_state:
            weakref.finalize(program, _first_state.pop, id(program), None)
        _first_state[id(program)] = snapshot_program(program)
    try:
        return (yield)
    except Exception as exc:
        try:
            before, faithful = _rebuild(context)
            context.record.repro = str(write_reproducer(context, before, exc, faithful=faithful))
        except Exception as failure:  # noqa: BLE001 - the step's error matters more than ours
            context.record.repro = f"not written: {type(failure).__name__}: {failure}"
        raise


def _rebuild(context: StepContext) -> tuple[Program, bool]:
    """The program before the failing step: its first state with the steps that ran applied
    again; and whether that gives the same graphs as the failing run had."""
    from passkit.artifacts.snapshot import snapshot_program

    program = snapshot_program(_first_state[id(context.program)])
    ran = set(context.previous)
    for step in context.pipeline.steps[: context.step.position]:
        if step.id not in ran:
            continue
        before = program.graph_hash()
        step.pass_.run(program, step.options)
        holding = after(program.facts, step.pass_, graphs_changed=program.graph_hash() != before, table=context.known_facts)
        for name in program.facts - holding:
            fact = context.known_facts.get(name)
            if fact is not None and fact.discard is not None:
                fact.discard(program)
        program.facts = holding
    program.stats.clear()
    return program, program.graph_hash() == context.graph_hash_before
