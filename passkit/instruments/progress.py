"""Own the progress of a running step: a wrapper hookimpl that says when a long step started
and keeps saying it is alive.

A timer watches each step. Once the step has run ``passkit.core.progress.STARTED_AFTER_S``
seconds it sends a ``started`` event (``[9/9] codegen.inductor: started, running for 1.0 s``),
then a ``heartbeat`` every ``HEARTBEAT_EVERY_S`` seconds with the elapsed time and the pass's own
phrase (``passkit.core.progress.detail``), until the step ends. A step quicker than the threshold
sends nothing, so short steps stay one line each. Events go to the run's progress callback
(``context.progress``) through ``passkit.core.progress.send``. Registered after the other step
instruments, it is the outermost of them: the time it reports is the whole step's, dumps and
verification included.

One daemon thread (``passkit-step-timer``) times every watched step of the process. A thread of
its own per step cost each step a thread start and join, about a millisecond on a loaded 2-core
machine: more than most steps of a small program take (the 1,440 programs of one OpInfo entry
spent more time starting watch threads than in ``decompose``). The timer touches a step only
with its lock held, and ``stop`` takes the step back under that lock, so once a step returns the
timer holds no reference to it: idle, it holds none at all, and nothing of a step is freed on
that thread while the interpreter exits (a thread that outlived its step once did, inside
torch's C++, and aborted the process).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Generator

from passkit.core import progress
from passkit.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext

__all__ = ["passkit_run_step", "StepWatch"]


class StepWatch:
    """One step's ``started`` and ``heartbeat`` events, sent by the process's timer thread from
    ``start`` until ``stop``, after which none is sent."""

    def __init__(self, context: StepContext) -> None:
        self.context = context
        self.step = progress.RunningStep()
        self.started = time.perf_counter()
        self.due = self.started + progress.STARTED_AFTER_S  # when the next event is due
        self.announced = False  # whether ``started`` was sent

    def start(self) -> None:
        _timer.add(self)

    def stop(self) -> None:
        _timer.remove(self)

    def fire(self, now: float) -> None:
        """Send the event that is due (called by the timer, with its lock held)."""
        self._send("heartbeat" if self.announced else "started", now)
        self.announced = True
        self.due = now + progress.HEARTBEAT_EVERY_S

    def _send(self, kind: progress.EventKind, now: float) -> None:
        context = self.context
        step, total = context.step, len(context.pipeline.steps)
        seconds = now - self.started
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


class _Timer:
    """The thread that sends the events of every watched step when they are due."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._watches: list[StepWatch] = []
        self._thread: threading.Thread | None = None

    def add(self, watch: StepWatch) -> None:
        with self._lock:
            self._watches.append(watch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="passkit-step-timer", daemon=True)
                self._thread.start()
            self._lock.notify()

    def remove(self, watch: StepWatch) -> None:
        with self._lock:
            self._watches = [held for held in self._watches if held is not watch]

    def _run(self) -> None:
        with self._lock:
            while True:
                now = time.perf_counter()
                for watch in [held for held in self._watches if held.due <= now]:
                    try:
                        watch.fire(now)
                    except Exception:  # noqa: BLE001 - one failing callback must not silence the other steps
                        progress.log.exception("passkit: a progress callback failed")
                watch = None  # type: ignore[assignment]  # idle, the timer holds no step
                due = min((held.due for held in self._watches), default=None)
                self._lock.wait(None if due is None else max(due - time.perf_counter(), 0.0))


_timer = _Timer()


def _fresh_timer_in_child() -> None:
    # A forked child has no timer thread, and the lock may have been held at the fork.
    global _timer
    _timer = _Timer()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_timer_in_child)


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
