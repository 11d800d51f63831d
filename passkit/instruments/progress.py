"""Own the progress of a running step: a wrapper hookimpl that says when a long step started
and keeps saying it is alive.

A timer thread watches each step. Once the step has run ``passkit.core.progress.STARTED_AFTER_S``
seconds it sends a ``started`` event (``[9/9] codegen.inductor: started, running for 1.0 s``),
then a ``heartbeat`` every ``HEARTBEAT_EVERY_S`` seconds with the elapsed time and the pass's own
phrase (``passkit.core.progress.detail``), until the step ends. A step quicker than the threshold
sends nothing, so short steps stay one line each. Events go to the run's progress callback
(``context.progress``) through ``passkit.core.progress.send``. Registered after the other step
instruments, it is the outermost of them: the time it reports is the whole step's, dumps and
verification included.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Generator

from passkit.core import progress
from passkit.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext

__all__ = ["passkit_run_step", "StepWatch"]


class StepWatch:
    """A daemon thread that sends ``started`` and ``heartbeat`` events for one step until ``stop``,
    which ends it."""

    def __init__(self, context: StepContext) -> None:
        self.context = context
        self.step = progress.RunningStep()
        self.started = time.perf_counter()
        self._done = threading.Event()
        self._lock = threading.Lock()  # no event is sent once ``stop`` returned
        self._thread = threading.Thread(target=self._watch, name=f"passkit-progress-{context.step.id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._done.set()
        # The thread wakes at once; joining it means its last reference to this watch (and so to
        # the step's tensors) is dropped before the step returns. A daemon thread still freeing
        # tensors while the interpreter exits is killed inside torch's C++ and aborts the process.
        self._thread.join()

    def _watch(self) -> None:
        if self._done.wait(progress.STARTED_AFTER_S):
            return
        self._send("started")
        while not self._done.wait(progress.HEARTBEAT_EVERY_S):
            self._send("heartbeat")

    def _send(self, kind: progress.EventKind) -> None:
        context = self.context
        step, total = context.step, len(context.pipeline.steps)
        with self._lock:
            if self._done.is_set():
                return
            seconds = time.perf_counter() - self.started
            detail = self.step.detail() if kind == "heartbeat" else ""
            head = f"[{step.position + 1}/{total}] {step.id}"
            if kind == "started":
                text = f"{head}: started, running for {seconds:.1f} s"
            else:
                text = f"{head}: still running, {seconds:.1f} s" + (f", {detail}" if detail else "")
            event = progress.ProgressEvent(
                kind=kind, text=text, step_id=step.id, pass_name=step.pass_.name, position=step.position,
                total=total, seconds=seconds, detail=detail,
            )
            progress.send(context.progress, event)


@hookimpl(wrapper=True)
def passkit_run_step(context: StepContext) -> Generator[None, bool | None, bool | None]:
    """Watch the step while it runs; a step shorter than the threshold sends nothing."""
    watch = StepWatch(context)
    watch.start()
    try:
        with progress.running_step(watch.step):
            return (yield)
    finally:
        watch.stop()
