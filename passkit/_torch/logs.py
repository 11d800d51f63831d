"""Own torch's logging and compile-id plumbing: structured trace artifacts (``tlparse``), Dynamo's
compile id, the code and inputs of the frame Dynamo is compiling, and a graph's code generator.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Callable, Sequence

import torch
import torch.fx

__all__ = [
    "current_compile_id",
    "current_frame_id",
    "dynamo_code_location",
    "dynamo_input_names",
    "user_location",
    "torch_source_dir",
    "on_dynamo_frame_start",
    "on_dynamo_compile_end",
    "graph_codegen",
    "structured_trace_enabled",
    "trace_artifact",
]


def torch_source_dir() -> str:
    """The folder torch's Python sources are in: frames there are torch's, not the user's."""
    return os.path.dirname(torch.__file__)


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


# Wrappers torch and libraries put around a model's forward: a line names what they wrap.
# torch.compile(nn.Sequential) compiles external_utils' wrap_inline.<locals>.inner; Hugging Face
# wraps forward in deprecate_kwarg's wrapped_func, can_return_tuple's wrapper and the like.
_WRAPPER_FILES = (
    ("_dynamo", "external_utils.py"), ("nn", "modules", "module.py"), ("utils", "_contextlib.py"),
    ("transformers", "utils", "deprecation.py"), ("transformers", "utils", "generic.py"), ("functools.py",),
    ("contextlib.py",),
)


def _is_wrapper(code: Any) -> bool:
    parts = tuple(os.path.normpath(getattr(code, "co_filename", "")).split(os.sep))
    return any(parts[-len(tail):] == tail for tail in _WRAPPER_FILES)


def _at(name: str, code: Any) -> str:
    return f"{name} at {os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _code_name(code: Any) -> str:
    return getattr(code, "co_qualname", code.co_name)


def _unwrapped_code(fn: Any) -> Any:
    import inspect

    try:
        fn = inspect.unwrap(fn)
    except ValueError:  # a cycle of __wrapped__
        return None
    return getattr(getattr(fn, "__func__", fn), "__code__", None)


def user_location(code: Any, frame_locals: dict[str, Any] | None, traced: Sequence[Any] = ()) -> str:
    """The frame Dynamo compiles, named for the user: ``Block.forward at model.py:12``. When the
    frame is a wrapper (``wrap_inline.<locals>.inner`` around an ``nn.Sequential``, Hugging
    Face's ``deprecate_kwarg``), what it wraps: the module's class and its ``forward``, else the
    function it calls; else the first traced code outside torch and the wrappers."""
    if not _is_wrapper(code):
        return _at(_code_name(code), code)
    values = list((frame_locals or {}).values())
    values += [v for key in ("args",) for v in ((frame_locals or {}).get(key) or ())]
    for value in values:
        if isinstance(value, torch.nn.Module):
            found = _unwrapped_code(type(value).forward)
            if found is not None:
                return _at(f"{type(value).__name__}.forward", found)
    for value in values:
        found = _unwrapped_code(value) if callable(value) else None
        if found is not None and not _is_wrapper(found):
            return _at(_code_name(found), found)
    torch_dir = torch_source_dir()
    for other in traced:
        if not _is_wrapper(other) and not os.path.abspath(other.co_filename).startswith(torch_dir):
            return _at(_code_name(other), other)
    return _at(_code_name(code), code)


def _compiling() -> tuple[Any, dict[str, Any] | None, Any] | None:
    """Dynamo's ``_compile`` call on the stack: the code it compiles, that frame's locals and
    the backend; None outside it."""
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "_compile" and "compiler_fn" in frame.f_locals):
        frame = frame.f_back
    if frame is None:
        return None
    found = frame.f_locals
    frame_locals = found.get("locals")
    return found.get("code"), frame_locals if isinstance(frame_locals, dict) else None, found["compiler_fn"]


def dynamo_code_location() -> str | None:
    """The function whose frame Dynamo is compiling, as ``Model.forward at model.py:12`` (what a
    wrapper around it wraps: ``user_location``); ``None`` outside Dynamo (or where torch keeps
    no traced code)."""
    try:
        from torch._guards import TracingContext

        context = TracingContext.try_get()
        codes = list(getattr(context, "traced_code", None) or [])
        compiling = _compiling()
    except Exception:  # noqa: BLE001 - an API change costs the location, never the compile
        return None
    if compiling is not None and compiling[0] is not None:
        return user_location(compiling[0], compiling[1], codes)
    if not codes:
        return None
    return user_location(codes[0], None, codes)


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
    return _wrapped_argument_names(names)


_ARG = re.compile(r"^args\[(\d+)\]")


def _wrapped_argument_names(names: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Inside a wrapper's frame (``inner(*args)``), ``args[0]`` is named by the wrapped forward's
    parameter (``input``, ``input_ids``)."""
    try:
        compiling = _compiling()
        if compiling is None or compiling[0] is None or not _is_wrapper(compiling[0]):
            return names
        import inspect

        frame_locals = compiling[1] or {}
        args = list(frame_locals.get("args") or ())
        module = next((v for v in frame_locals.values() if isinstance(v, torch.nn.Module)), None)
        if module is None and args and isinstance(args[0], torch.nn.Module):
            module = args[0]
        if module is None:
            return names
        forward = inspect.unwrap(type(module).forward)
        parameters = list(inspect.signature(forward).parameters.values())
        if not (args and args[0] is module):
            parameters = parameters[1:]  # the wrapper calls the module: args start after self
        positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except Exception:  # noqa: BLE001 - a name is a nicety
        return names

    def rename(name: str) -> str:
        found = _ARG.match(name)
        if found is None or int(found[1]) >= len(positional):
            return name
        return positional[int(found[1])] + name[found.end():]

    return [(rename(name), state) for name, state in names]


_FRAME_STARTS: list[Callable[[Any, str, str], None]] = []


def _add_dynamo_callback(which: str, callback: Callable[[Any], None], handlers: list[Any], handler: Any) -> bool:
    """Put passkit's ``callback`` among Dynamo's ``which`` ("start" or "end") callbacks once (again
    after ``torch._dynamo.reset()`` cleared it) and ``handler`` among those it calls; False where
    torch has no such callbacks."""
    try:
        callbacks = torch._dynamo.callback_handler
        installed = callback in getattr(callbacks, f"{which}_callbacks")
    except AttributeError:
        return False
    if not installed:
        getattr(callbacks, f"register_{which}_callback")(callback)
    if handler not in handlers:
        handlers.append(handler)
    return True


def on_dynamo_frame_start(handler: Callable[[Any, str, str], None]) -> bool:
    """Call ``handler(backend, where, compile_id)`` each time Dynamo starts tracing a frame:
    the backend object given to ``torch.compile`` (unwrapped), ``Fn.name at file.py:12`` and
    the compile id. Dynamo's start callbacks say neither the frame nor the backend, so they are
    read off Dynamo's ``_compile`` frame on the stack. Returns False where torch has no start
    callbacks. Cheap to call again: ``torch._dynamo.reset()`` clears Dynamo's callbacks, and a
    second call puts passkit's back; a failing lookup calls nothing."""
    return _add_dynamo_callback("start", _frame_started, _FRAME_STARTS, handler)


def _frame_started(args: Any) -> None:
    try:
        compiling = _compiling()
        if compiling is None:
            return
        code, frame_locals, backend = compiling
        for _ in range(8):  # Dynamo's wrappers around the backend the user passed
            inner = getattr(backend, "_torchdynamo_orig_backend", None) or getattr(backend, "compiler_fn", None)
            if inner is None or inner is backend:
                break
            backend = inner
        where = user_location(code, frame_locals)
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
    return _add_dynamo_callback("end", _compile_ended, _COMPILE_ENDS, handler)


def _compile_ended(args: Any) -> None:
    pending = list(_COMPILE_ENDS)
    _COMPILE_ENDS.clear()
    for handler in pending:
        try:
            handler()
        except Exception:  # noqa: BLE001 - a report line must never cost the compile
            pass


def structured_trace_enabled() -> bool:
    """Whether torch's structured trace is on (``TORCH_TRACE`` set when torch was imported, or a
    handler a program attached to the trace's logger).

    pytest's log capture attaches its own handlers to every logger that does not propagate, the
    trace's included; those do not turn the trace on. Counted, they made every step of every
    compile under pytest emit its artifacts, each with the Python stack torch records when there
    is no Dynamo compile id: a fifth of a test's time."""
    from torch._logging._internal import trace_log

    return any(not type(handler).__module__.startswith("_pytest.") for handler in trace_log.handlers)


def trace_artifact(name: str, payload: str, *, encoding: str = "string") -> None:
    """Emit one artifact into torch's structured trace (what ``tlparse`` renders), under the
    current Dynamo compile id when there is one."""
    from torch._logging import trace_structured

    trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": encoding}, payload_fn=lambda: payload)
