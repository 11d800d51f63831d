"""Own per-step verification: a wrapper hookimpl that re-checks the program after each step.

With ``settings.verify`` set to ``"facts"`` or ``"numerics"``, every fact that holds after the
step (the established facts plus what the step produces, less what it invalidates) is checked
with ``passkit.facts.check_fact``, so a pass that silently breaks a fact is named at the step
that broke it. With ``"numerics"`` and a reference, the program's outputs and gradients are also
compared with the captured program's. ``tryfirst`` makes this the outermost wrapper: dumps of
the offending step are written before verification fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generator

from passkit.errors import VerificationError
from passkit.facts import check_fact
from passkit.hookspecs import hookimpl
from passkit.runner import facts_after

if TYPE_CHECKING:
    from passkit.runner import StepContext

__all__ = ["passkit_run_step", "verify_step"]


@hookimpl(wrapper=True, tryfirst=True)
def passkit_run_step(context: StepContext) -> Generator[None, bool | None, bool | None]:
    """Run the step, then verify it when ``settings.verify`` asks for it."""
    result = yield
    if context.settings.verify != "off":
        verify_step(context)
    return result


def verify_step(context: StepContext) -> None:
    """Raise ``VerificationError`` if the step broke a fact or (with numerics) changed results."""
    program = context.program
    holding = facts_after(program.facts, context.pass_, graphs_changed=context.graphs_changed)
    for fact in sorted(holding):
        reason = check_fact(program, fact)
        if reason is not None:
            raise VerificationError(f"{context.label} broke fact '{fact}': {reason}")
    if context.settings.verify == "numerics" and context.reference is not None:
        difference = context.reference.compare(program)
        if difference is not None:
            raise VerificationError(f"{context.label} changed numerics: {difference}")
