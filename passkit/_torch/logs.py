"""Own torch's logging and compile-id plumbing: structured trace artifacts (``tlparse``), Dynamo's
compile id, the code and inputs of the frame Dynamo is compiling, and a graph's code generator.
"""

from __future__ import annotations

from typing import Any

import os
import re
import sys
from typing import Callable

import torch
import torch.fx

__all__ = [
    "current_compile_id",
    "current_frame_id",
    "dynamo_code_location",
    "dynamo_input_names",
    "on_dynamo_frame_start",
    "on_dynamo_compile_end",
    "graph_codegen",
    "structured_trace_enabled",
    "trace_artifact",
]


def graph_codegen(graph: torch.fx.Graph) -> Any:
    """The graph's code generator (plain or pytree calling convention), to copy or serialise."""
    return graph._codegen


def _compile_id() -> Any:
    try:
        from torch._guards import CompileContext

        return CompileContext.current_compile_id()
    except Exception:  # outside Dynamo, or an API change: callers fall back
        return None


def current_compile_id() -> str | None:
    """Dynamo's id of the graph being compiled (``"0/1"``: frame 0, its second compile), if any."""
    compile_id = _compile_id()
    return None if compile_id is None else str(compile_id)


def current_frame_id() -> Any:
    """Which Dynamo frame (code location) the graph being compiled comes from; a recompile of that
    frame for new shapes keeps it. ``None`` outside Dynamo."""
    return getattr(_compile_id(), "frame_id", None)


def dynamo_code_location() -> str | None:
    """The function whose frame Dynamo is compiling, as ``Model.forward at model.py:12``;
    ``None`` outside Dynamo (or where torch keeps no traced code)."""
    try:
        from torch._guards import TracingContext

        context = TracingContext.try_get()
        codes = getattr(context, "traced_code", None) or []
    except Exception:  # noqa: BLE001 - an API change costs the location, never the compile
        return None
    if not codes:
        return None
    code = codes[0]
    name = getattr(code, "co_qualname", code.co_name)
    return f"{name} at {os.path.basename(code.co_filename)}:{code.co_firstlineno}"


_SOURCE_PART = re.compile(r"\._(?:modules|parameters|buffers)\['([^']+)'\]")
_LOCAL = re.compile(r"^L\['([^']+)'\]")


def dynamo_input_names(gm: torch.fx.GraphModule) -> list[tuple[str, bool]]:
    """Each input of Dynamo's graph named as the user's code reaches it (``x``,
    ``self.linear.weight``; the placeholder's name where Dynamo recorded no source), and whether
    it is a module's parameter or buffer."""
    names: list[tuple[str, bool]] = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = getattr(source, "name", None)
        try:
            text = name() if callable(name) else name
        except Exception:  # noqa: BLE001
            text = None
        if not isinstance(text, str):
            names.append((node.name, "_parameters_" in node.name or "_buffers_" in node.name))
            continue
        state = "._parameters[" in text or "._buffers[" in text
        names.append((_SOURCE_PART.sub(r".\1", _LOCAL.sub(r"\1", text)), state))
    return names


_FRAME_STARTS: list[Callable[[Any, str, str], None]] = []


def on_dynamo_frame_start(handler: Callable[[Any, str, str], None]) -> bool:
    """Call ``handler(backend, where, compile_id)`` each time Dynamo starts tracing a frame:
    the backend object given to ``torch.compile`` (unwrapped), ``Fn.name at file.py:12`` and
    the compile id. Dynamo's start callbacks say neither the frame nor the backend, so they are
    read off Dynamo's ``_compile`` frame on the stack. Returns False where torch has no start
    callbacks. Cheap to call again: ``torch._dynamo.reset()`` clears Dynamo's callbacks, and a
    second call puts passkit's back; a failing lookup calls nothing."""
    try:
        callbacks = torch._dynamo.callback_handler
        installed = _frame_started in callbacks.start_callbacks
    except AttributeError:
        return False
    if not installed:
        callbacks.register_start_callback(_frame_started)
    if handler not in _FRAME_STARTS:
        _FRAME_STARTS.append(handler)
    return True


def _frame_started(args: Any) -> None:
    try:
        frame = sys._getframe(1)
        while frame is not None and not (frame.f_code.co_name == "_compile" and "compiler_fn" in frame.f_locals):
            frame = frame.f_back
        if frame is None:
            return
        code, backend = frame.f_locals.get("code"), frame.f_locals["compiler_fn"]
        for _ in range(8):  # Dynamo's wrappers around the backend the user passed
            inner = getattr(backend, "_torchdynamo_orig_backend", None) or getattr(backend, "compiler_fn", None)
            if inner is None or inner is backend:
                break
            backend = inner
        name = getattr(code, "co_qualname", getattr(code, "co_name", "?"))
        where = f"{name} at {os.path.basename(getattr(code, 'co_filename', '?'))}:{getattr(code, 'co_firstlineno', 0)}"
        compile_id = str(getattr(args, "compile_id", "") or "")
    except Exception:  # noqa: BLE001 - a progress line must never cost the compile
        return
    for handler in list(_FRAME_STARTS):
        try:
            handler(backend, where, compile_id)
        except Exception:  # noqa: BLE001
            pass


_COMPILE_ENDS: list[Callable[[], None]] = []


def on_dynamo_compile_end(handler: Callable[[], None]) -> bool:
    """Call ``handler()`` once, when the Dynamo compile under way (or the next one) ends; False
    where torch has no end callbacks. Asking twice before the end calls it once."""
    try:
        callbacks = torch._dynamo.callback_handler
        installed = _compile_ended in callbacks.end_callbacks
    except AttributeError:
        return False
    if not installed:
        callbacks.register_end_callback(_compile_ended)
    if handler not in _COMPILE_ENDS:
        _COMPILE_ENDS.append(handler)
    return True


def _compile_ended(args: Any) -> None:
    pending = list(_COMPILE_ENDS)
    _COMPILE_ENDS.clear()
    for handler in pending:
        try:
            handler()
        except Exception:  # noqa: BLE001 - a report line must never cost the compile
            pass


def structured_trace_enabled() -> bool:
    """Whether torch's structured trace is on (``TORCH_TRACE`` set when torch was imported)."""
    from torch._logging._internal import trace_log

    return bool(trace_log.handlers)


def trace_artifact(name: str, payload: str, *, encoding: str = "string") -> None:
    """Emit one artifact into torch's structured trace (what ``tlparse`` renders), under the
    current Dynamo compile id when there is one."""
    from torch._logging import trace_structured

    trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": encoding}, payload_fn=lambda: payload)
