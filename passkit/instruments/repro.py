"""Own crash reproducers: a wrapper hookimpl that writes a replayable folder for a failing step.

With ``settings.repro_dir`` set (the default, ``passkit-repro``), the program is snapshotted
before each step (``passkit.debug.snapshot``); when the step raises, breaks a fact or changes
numerics, ``passkit.debug.repro.write_reproducer`` writes the folder, ``record.repro`` names it
and the runner's one-line error ends with ``(reproducer: <folder>)``. ``repro_dir = ""`` turns
this off, and with it the snapshot's cost. Registered after ``verify``, it wraps it, so
verification failures are caught too. Writing a reproducer never hides the step's own error:
if writing fails, the record says why instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generator

from passkit.hookspecs import hookimpl

if TYPE_CHECKING:
    from passkit.hookspecs import StepContext

__all__ = ["passkit_run_step"]


@hookimpl(wrapper=True)
def passkit_run_step(context: StepContext) -> Generator[None, bool | None, bool | None]:
    """Snapshot the program, run the step, and write a reproducer if it fails."""
    if not context.pipeline.settings.repro_dir:
        return (yield)
    from passkit.debug.repro import write_reproducer
    from passkit.debug.snapshot import snapshot_program

    before = snapshot_program(context.program)
    try:
        return (yield)
    except Exception as exc:
        try:
            context.record.repro = str(write_reproducer(context, before, exc))
        except Exception as failure:  # noqa: BLE001 - the step's error matters more than ours
            context.record.repro = f"not written: {type(failure).__name__}: {failure}"
        raise
