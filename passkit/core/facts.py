"""Own facts: the named states of a program that passes rely on, and every rule about them.

A ``Fact`` has a name, a description and a checker. Plugins define facts through
``passkit_register_facts``; the built-in ones too (``passkit.passes.core_facts`` registers the
structural facts, ``functionalize`` and ``decompose`` the facts they establish). Three rules live here
and nowhere else:

- ``skip_reason`` / ``applies``: whether a step runs in a training or an inference plan;
- ``after``: which facts hold after a step ran;
- ``failed_checks``: which holding facts a program actually breaks (``verify = "facts"``).

The loop, the contract check, the instruments and the pytest plugin all use these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

if TYPE_CHECKING:
    from passkit.core.pass_api import Pass
    from passkit.core.program import Program

__all__ = [
    "Fact",
    "INITIAL_FACTS",
    "FINAL_FACT",
    "after",
    "applies",
    "skip_reason",
    "failed_checks",
]

INITIAL_FACTS = frozenset({"captured"})
FINAL_FACT = "compiled"


@dataclass(frozen=True)
class Fact:
    """A named state of a program, with a checker that says why a program breaks it.

    ``check(program)`` returns None when the fact holds, else a one-line reason. A fact with
    ``tied_to_graphs`` describes artefacts built from the graphs (compiled callables): it stops
    holding when a step changes the graphs without producing it again, and ``discard`` then
    drops those artefacts.
    """

    name: str
    description: str
    check: Callable[[Program], str | None] | None = None
    tied_to_graphs: bool = False
    discard: Callable[[Program], None] | None = None


def skip_reason(*, enabled: bool, when: str | None, pass_: Pass, training: bool) -> str:
    """Why a step does not run in a training (or inference) plan; ``""`` when it runs."""
    if not enabled:
        return "disabled"
    kind = "training" if training else "inference"
    if when is not None and when != kind:
        return f"when = {when}"
    if pass_.training_only and not training:
        return "inference program"
    return ""


def applies(*, enabled: bool, when: str | None, pass_: Pass, training: bool) -> bool:
    """Whether a step runs in a training (or inference) plan."""
    return not skip_reason(enabled=enabled, when=when, pass_=pass_, training=training)


def after(facts: Iterable[str], pass_: Pass, *, graphs_changed: bool, table: Mapping[str, Fact]) -> set[str]:
    """The facts that hold after ``pass_`` ran on a program holding ``facts``.

    A pass adds what it produces and removes what it invalidates; a changed graph also ends
    every fact tied to the graphs that the pass did not produce again.
    """
    holding = (set(facts) | pass_.produces) - pass_.invalidates
    if graphs_changed:
        holding -= {
            name for name in holding if name not in pass_.produces and name in table and table[name].tied_to_graphs
        }
    return holding


def failed_checks(program: Program, facts: Iterable[str], table: Mapping[str, Fact]) -> list[tuple[str, str]]:
    """``(fact, reason)`` for every fact in ``facts`` that ``program`` breaks, by name."""
    failures = []
    for name in sorted(facts):
        fact = table.get(name)
        reason = fact.check(program) if fact is not None and fact.check is not None else None
        if reason is not None:
            failures.append((name, reason))
    return failures
