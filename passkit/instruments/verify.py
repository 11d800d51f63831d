"""Own per-step verification: a wrapper hookimpl that re-checks the program after each step.

With ``settings.verify`` set to ``"facts"`` or ``"numerics"``, every fact that holds after the
step (the established facts plus what the step produces, less what it invalidates) is checked
with its registered checker (``passkit.core.facts.failed_checks``), plugin facts included, so a pass
that silently breaks a fact is named at the step that broke it. With ``"numerics"`` and a
reference, the program's outputs and gradients are also compared with the captured program's,
within the settings' ``rtol``/``atol`` loosened by the tolerance every step run so far declares
(``passkit.verify.compare.tolerance_for``, the rule ``passkit run`` and ``passkit bisect`` use); the error
prints the tolerance it held the program to.
Registered last of the instruments, it is the outermost of them: dumps of the offending step
are written before verification fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generator

from passkit.errors import VerificationError
from passkit.verify.compare import tolerance_for
from passkit.core.facts import failed_checks
from passkit.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext

__all__ = ["passkit_run_step", "verify_step"]


@hookimpl(wrapper=True)
def passkit_run_step(context: StepContext) -> Generator[None, bool | None, bool | None]:
    """Run the step, then verify it when ``settings.verify`` asks for it."""
    result = yield
    if context.pipeline.settings.verify != "off":
        verify_step(context)
    return result


def verify_step(context: StepContext) -> None:
    """Raise ``VerificationError`` if the step broke a fact or (with numerics) changed results."""
    program = context.program
    for fact, reason in failed_checks(program, context.facts_after(), context.known_facts):
        raise VerificationError(f"{context.label} broke fact '{fact}': {reason}")
    if context.pipeline.settings.verify == "numerics" and context.reference is not None:
        ran = set(context.previous) | {context.step.id}
        tolerance = tolerance_for(context.pipeline.settings, (step for step in context.pipeline.steps if step.id in ran))
        difference = context.reference.compare(program, tolerance)
        if difference is not None:
            raise VerificationError(f"{context.label} changed numerics: {difference}")
