"""Own warnings that point at the user's code: the first caller outside passkit, torch and the
standard library.

A compile runs deep inside Dynamo, so ``warnings.warn(stacklevel=...)`` would name a line in
torch's source. ``warn_at_user_code`` walks the stack instead and attributes the warning to the
user's own line (the call of the compiled model), which is where a user can act on it.
"""

from __future__ import annotations

import inspect
import os
import sys
import sysconfig
import warnings
from types import FrameType

import torch

_PASSKIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # passkit/, above frontends/

__all__ = ["warn_at_user_code", "user_frame"]


def _library_roots() -> tuple[str, ...]:
    roots = {_PASSKIT_DIR, os.path.dirname(inspect.getfile(torch))}
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(path)
    for module in ("click", "pluggy", "pydantic"):  # the CLI and the plugin machinery
        loaded = sys.modules.get(module)
        if loaded is not None and getattr(loaded, "__file__", None):
            roots.add(os.path.dirname(loaded.__file__))
    return tuple(os.path.realpath(root) + os.sep for root in roots)


def user_frame() -> FrameType | None:
    """The innermost frame on the stack whose code is not passkit's, torch's or the stdlib's."""
    roots = _library_roots()
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<") and not os.path.realpath(filename).startswith(roots):
            return frame
        frame = frame.f_back
    return None


def warn_at_user_code(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn`` attributed to the user's line (or the caller's, if none is on the stack)."""
    frame = user_frame()
    if frame is None:
        warnings.warn(message, category, stacklevel=3)
        return
    warnings.warn_explicit(
        message,
        category,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__", "<unknown>"),
        registry=frame.f_globals.setdefault("__warningregistry__", {}),
        module_globals=frame.f_globals,
    )
