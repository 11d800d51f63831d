"""Own step timing: a wrapper hookimpl that measures each step's wall time.

``trylast`` makes it the innermost wrapper, so the figure is the pass's own time and excludes
dumping and verification.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Generator

from passkit.hookspecs import hookimpl

if TYPE_CHECKING:
    from passkit.runner import StepContext

__all__ = ["passkit_run_step"]


@hookimpl(wrapper=True, trylast=True)
def passkit_run_step(context: StepContext) -> Generator[None, bool | None, bool | None]:
    """Record the step's wall time in ``context.record.seconds``, also when it fails."""
    started = time.perf_counter()
    try:
        return (yield)
    finally:
        context.record.seconds = time.perf_counter() - started
