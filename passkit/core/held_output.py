"""Own holding back Python warnings and log records while passkit prints something that must stay
whole (a step table), and letting them out afterwards, or dropping them.

``HeldOutput`` replaces ``warnings.showwarning`` and puts a filter on every handler of the
``torch`` loggers and the root logger (where torch's logs and Dynamo's graph dumps go). While ``holding`` is
true, a warning or record that would have been printed is kept instead; ``release()`` prints the
kept ones through their own handler (or the original ``showwarning``), in order; ``drop()``
forgets them. ``close()`` releases what is left and puts everything back. Nothing is lost: a
held line is printed later, never silenced, unless the caller drops it on purpose (torch's dump
of a capture that failed, which the error replaces).
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any, Callable

__all__ = ["HeldOutput"]



def _handlers() -> list[logging.Handler]:
    """The handlers of the root logger (a user's ``basicConfig``) and of every ``torch`` logger
    (torch puts its own on ``torch._dynamo``, ``torch._inductor`` and the others), once each."""
    names = [name for name in list(logging.Logger.manager.loggerDict) if name == "torch" or name.startswith("torch.")]
    found: dict[int, logging.Handler] = {}
    for logger in [logging.getLogger(), *(logging.getLogger(name) for name in names)]:
        for handler in logger.handlers:
            found.setdefault(id(handler), handler)
    return list(found.values())


class _HoldFilter(logging.Filter):
    def __init__(self, owner: HeldOutput, handler: logging.Handler) -> None:
        super().__init__()
        self.owner, self.handler = owner, handler

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.owner._keep(lambda: self.handler.handle(record))


class HeldOutput:
    """Warnings and log records held back while ``holding``; see the module's docstring."""

    def __init__(self, *, holding: bool = False) -> None:
        self.holding = holding
        self._held: list[Callable[[], Any]] = []
        self._lock = threading.RLock()
        self._releasing = False
        self._show = warnings.showwarning
        warnings.showwarning = self._show_warning
        self._filters: list[tuple[logging.Handler, _HoldFilter]] = []
        for handler in _handlers():
            hold = _HoldFilter(self, handler)
            handler.filters.insert(0, hold)  # before an outer HeldOutput's: the innermost holds
            self._filters.append((handler, hold))

    def _keep(self, show: Callable[[], Any]) -> bool:
        with self._lock:
            if not self.holding or self._releasing:
                return False
            self._held.append(show)
            return True

    def _show_warning(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        show = self._show
        if not self._keep(lambda: show(message, category, filename, lineno, file, line)):
            show(message, category, filename, lineno, file, line)

    def release(self) -> None:
        """Print what was held, in order."""
        with self._lock:
            held, self._held = self._held, []
            self._releasing = True
            try:
                for show in held:
                    show()
            finally:
                self._releasing = False

    def drop(self) -> None:
        """Forget what was held."""
        with self._lock:
            self._held = []

    def close(self) -> None:
        """Release what is left; warnings and handlers are as they were before."""
        self.holding = False
        self.release()
        if warnings.showwarning == self._show_warning:
            warnings.showwarning = self._show
        for handler, hold in self._filters:
            handler.removeFilter(hold)
        self._filters = []
