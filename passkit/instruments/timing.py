"""Own step timing: a wrapper hookimpl that measures each step's wall time.

Registered first of the instruments, it is the innermost wrapper (see ``passkit.core.hookspecs``),
so the figure is the pass's own time and excludes dumping and verification.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Generator

from passkit.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext

__all__ = ["passkit_run_step"]


@hookimpl(wrapper=True)
def passkit_run_step(context: StepContext) -> Generator[None, bool | None, bool | None]:
    """Record the step's wall time in ``context.record.seconds``, also when it fails."""
    started = time.perf_counter()
    try:
        return (yield)
    finally:
        context.record.seconds = time.perf_counter() - started
