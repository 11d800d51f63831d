"""Own capturing a model with ``torch.export`` for ``passkit.export`` (and the export bisect), and
turning a capture that fails into one line: the model's line and torch's reason.

A model that raises in ``forward``, a branch on a tensor's value (``if x.sum() > 0:``), a
dimension marked dynamic that the model fixes: torch raises its own error, often after logging
the graph it had traced, and the whole reads as hundreds of lines. ``capture`` holds torch's log
lines and what it prints on stderr back while it exports (``passkit.core.held_output``), and
on a failure drops them and raises a ``CaptureError`` whose message is one line. ``PASSKIT_DEBUG=1`` keeps everything:
torch's log lines are printed and its error is the ``CaptureError``'s cause.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import sysconfig
import traceback
from typing import Any

import torch

from passkit.core.held_output import HeldOutput
from passkit.errors import CaptureError, debug_enabled

__all__ = ["capture", "capture_error"]

_FULL_TEXT = "(PASSKIT_DEBUG=1 shows the full error)"


def capture(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
            dynamic_shapes: Any = None) -> torch.export.ExportedProgram:
    """``torch.export.export`` (non-strict, torch's default); ``CaptureError`` where it fails."""
    held, printed = HeldOutput(holding=True), io.StringIO()
    try:
        with contextlib.redirect_stderr(printed):  # torch prints the partial graph of a failure there
            return torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    except Exception as exc:
        if debug_enabled():
            raise capture_error(exc, model) from exc
        held.drop()
        printed = io.StringIO()
        raise capture_error(exc, model) from None  # torch's error stays the __context__
    finally:
        held.close()
        sys.stderr.write(printed.getvalue())


def capture_error(exc: BaseException, model: Any) -> CaptureError:
    """One line for ``exc``, raised while ``model`` was captured: who raised, where in the
    model's code, and why."""
    name = type(model).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    users = [frame for frame in frames if _is_users(frame.filename)]
    where = ""
    if users:
        frame = users[-1]
        code = f" ({frame.line.strip()})" if frame.line else ""
        where = f" at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}{code}"
    reason = f"{type(exc).__name__}: {_reason(exc)}"
    if (users and frames[-1] is users[-1]) or not type(exc).__module__.startswith("torch"):
        return CaptureError(f"passkit.export: {name} raised {reason}{where} {_FULL_TEXT}")
    return CaptureError(f"passkit.export: torch.export cannot capture {name}{where}: {reason} {_FULL_TEXT}")


def _reason(exc: BaseException) -> str:
    """torch's reason in a sentence or two: the message's first line without the advice to
    turn on torch's logs, and the first item of a list of violations (``- You marked dim1 ...``)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    first = lines[0].split(" For more information, run with", 1)[0].split("  ", 1)[0].strip()
    item = next((line[2:] for line in lines[1:] if line.startswith("- ")), None)
    if item is not None:
        first += " " + item.split(". ", 1)[0].rstrip(".") + "."
    return first


_NOT_USERS = tuple(os.path.dirname(path) + os.sep for path in (torch.__file__, __import__("passkit").__file__))
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def _is_users(filename: str) -> bool:
    """Whether ``filename`` is the user's code: not torch's, passkit's, Python's, or generated."""
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    return not path.startswith(_NOT_USERS) and not (path.startswith(_STDLIB) and "site-packages" not in path)
