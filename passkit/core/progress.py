"""Own progress events: what passkit says while a compile runs, besides each finished step.

A ``progress`` callback (``passkit.compile(model, progress=callback)``) is called with each
finished step's ``StepRecord``, as it always was. Long work also produces ``ProgressEvent``\\ s:

- ``tracing``: Dynamo started tracing a frame for passkit (its code location), before any graph;
- ``compiling``: a graph reached passkit (its Dynamo frame, code location and inputs);
- ``recompiling``: the same frame again, with what changed since its previous compile
  (input shapes, dtypes, requires-grad, grad mode);
- ``started``: a step has been running for ``STARTED_AFTER_S`` seconds (fast steps say nothing);
- ``heartbeat``: every ``HEARTBEAT_EVERY_S`` seconds after that, with the elapsed time and what
  the pass reports of its own progress (``codegen.inductor``: the kernels generated so far).

A callback that has an ``event`` attribute (a method, or a function's attribute) receives the
events. Without a callback, each event's ``text`` is logged at INFO on the ``passkit`` logger,
like the finished steps. A callback without ``event`` replaces the log, as it always did: it
keeps getting only records, and the events go nowhere.

A pass reports its own progress with ``with passkit.core.progress.detail(fn):``; while the block
runs, each heartbeat of its step appends ``fn()`` (a short phrase). Events come from a timer
thread, so a callback's ``event`` must be safe to call from another thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Literal

__all__ = [
    "STARTED_AFTER_S",
    "HEARTBEAT_EVERY_S",
    "ProgressEvent",
    "RunningStep",
    "send",
    "log_event",
    "detail",
    "running_step",
]

STARTED_AFTER_S = 1.0
"""A step that runs this long gets a ``started`` line; quicker steps only get their row."""
HEARTBEAT_EVERY_S = 5.0
"""After ``started``, a ``heartbeat`` line this often until the step finishes."""

log = logging.getLogger("passkit")

EventKind = Literal["tracing", "compiling", "recompiling", "started", "heartbeat", "waiting"]


@dataclass(frozen=True)
class ProgressEvent:
    """One progress event. ``text`` is the line passkit logs for it; the other fields are the
    same facts as data. ``position`` is 0-based like ``StepRecord.position`` (-1 for compile
    events); ``seconds`` is the step's elapsed time; ``detail`` is the pass's own report."""

    kind: EventKind
    text: str
    step_id: str = ""
    pass_name: str = ""
    position: int = -1
    total: int = 0
    seconds: float = 0.0
    detail: str = ""
    graph: str = ""


def send(progress: Any, event: ProgressEvent) -> None:
    """Hand ``event`` to ``progress.event`` when the callback takes events; without a callback,
    log its text; a callback of records only gets nothing (it replaces the log)."""
    if progress is None:
        log_event(event)
        return
    handler = getattr(progress, "event", None)
    if callable(handler):
        handler(event)


def log_event(event: ProgressEvent) -> None:
    """Log the event's line at INFO on the ``passkit`` logger (the default progress)."""
    log.info("%s", event.text)


class RunningStep:
    """The step running on one thread, as the progress instrument watches it: what the pass
    reports of its own progress (``detail``), read by the timer thread at each heartbeat."""

    def __init__(self) -> None:
        self._detail: Callable[[], str] | None = None
        self._lock = threading.Lock()

    def set_detail(self, describe: Callable[[], str] | None) -> None:
        with self._lock:
            self._detail = describe

    def detail(self) -> str:
        """The pass's phrase now ("12 kernels generated"), or "" (a failing phrase is no phrase)."""
        with self._lock:
            describe = self._detail
        if describe is None:
            return ""
        try:
            return str(describe())
        except Exception:  # noqa: BLE001 - a progress phrase must never fail a compile
            return ""


_current = threading.local()


@contextlib.contextmanager
def running_step(step: RunningStep) -> Iterator[RunningStep]:
    """Make ``step`` the one ``detail`` reports to on this thread, for the block."""
    outer = getattr(_current, "step", None)
    _current.step = step
    try:
        yield step
    finally:
        _current.step = outer


@contextlib.contextmanager
def detail(describe: Callable[[], str]) -> Iterator[None]:
    """Inside a pass: while the block runs, heartbeats of the step append ``describe()``.

    Example::

        with passkit.core.progress.detail(lambda: f"{len(done)} of {total} graphs"):
            for graph in graphs:
                ...

    Outside a step watched by the progress instrument it does nothing.
    """
    step: RunningStep | None = getattr(_current, "step", None)
    if step is None:
        yield
        return
    step.set_detail(describe)
    try:
        yield
    finally:
        step.set_detail(None)
