"""Own naming where in the user's program a failing step failed: the graph node and source line.

A pass that fails while it works on one node (an interpreter re-tracing a graph, a loop over
``graph.nodes``, a pass that raises with ``exc.node = node``) leaves that node in the
exception's traceback. ``where_it_failed`` finds it without the pass doing anything, and names
it with the last frame of its ``stack_trace`` (the user's line that created it), so a one-line
error reads ``... failed at node view_8 (aten.view.default, modeling_llama.py:270): ...``.
"""

from __future__ import annotations

import os
import re
import traceback
from typing import Any

__all__ = ["failing_node", "where_it_failed", "source_line"]

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<fn>\S+))?')
_NODE_LOCALS = ("node", "n")


def _is_fx_node(value: Any) -> bool:
    cls = type(value)
    return cls.__name__ == "Node" and cls.__module__ == "torch.fx.node"


def _is_interpreter(value: Any) -> bool:
    return any(c.__name__ == "Interpreter" and c.__module__ == "torch.fx.interpreter" for c in type(value).__mro__)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def failing_node(exc: BaseException) -> Any | None:
    """The FX node a pass was working on when ``exc`` was raised, or None.

    In order: a node the pass attached (``exc.node``); the node an FX interpreter was running
    (the innermost one, which is the graph the pass read); a ``node``/``n`` local of the
    innermost frame that has one.
    """
    for error in _chain(exc):
        attached = getattr(error, "node", None)
        if _is_fx_node(attached):
            return attached
    fallback = None
    for error in _chain(exc):
        frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__)]
        for frame in reversed(frames):
            for name in _NODE_LOCALS:
                value = frame.f_locals.get(name)
                if not _is_fx_node(value):
                    continue
                if _is_interpreter(frame.f_locals.get("self")):
                    return value
                if fallback is None:
                    fallback = value
    return fallback


def source_line(node: Any) -> str | None:
    """``file:line`` of the last frame in the node's ``stack_trace`` (the user's own line)."""
    stack = node.meta.get("stack_trace") if hasattr(node, "meta") else None
    if not stack:
        return None
    frames = list(_FRAME.finditer(stack))
    if not frames:
        return None
    last = frames[-1]
    return f"{os.path.basename(last['file'])}:{last['line']}"


def where_it_failed(exc: BaseException) -> str:
    """`` at node NAME (TARGET, FILE:LINE)``, or an empty string when no node is known."""
    node = failing_node(exc)
    if node is None:
        return ""
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    if node.op == "call_function":
        target = str(node.target)
    details = [target]
    line = source_line(node)
    if line:
        details.append(line)
    return f" at node {node.name} ({', '.join(details)})"
