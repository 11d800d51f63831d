"""Own torch's logging and compile-id plumbing: structured trace artifacts (``tlparse``), Dynamo's
compile id, and a graph's code generator.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

__all__ = [
    "current_compile_id",
    "current_frame_id",
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


def structured_trace_enabled() -> bool:
    """Whether torch's structured trace is on (``TORCH_TRACE`` set when torch was imported)."""
    from torch._logging._internal import trace_log

    return bool(trace_log.handlers)


def trace_artifact(name: str, payload: str, *, encoding: str = "string") -> None:
    """Emit one artifact into torch's structured trace (what ``tlparse`` renders), under the
    current Dynamo compile id when there is one."""
    from torch._logging import trace_structured

    trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": encoding}, payload_fn=lambda: payload)
