"""Own the built-in ``passkit_run_step``: apply the step's pass with its validated options.

It is an essential built-in plugin (it cannot be blocked): every wrapper instrument wraps it,
and a plugin that wants to run passes differently returns a result from its own
``passkit_run_step`` first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from passkit.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext

__all__ = ["passkit_run_step"]


@hookimpl
def passkit_run_step(context: StepContext) -> bool:
    """Apply the step's pass with its options; return the pass's own claim of change."""
    return context.step.pass_.run(context.program, context.step.options, context=context)
