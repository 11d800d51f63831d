"""Own what tracing a user function shows about autograd that the traced graph does not keep.

The graph records ops only. Two facts live on the autograd tape while the function runs:
which outputs require grad (``a.view(-1).requires_grad_()`` makes one without an op), and
whether a custom ``torch.autograd.Function`` ran. Such a Function's backward never reaches the
graph, so differentiating the traced forward would be a silent wrong gradient wherever the
backward is not the forward's derivative: capture then keeps the user's function, and ``joint``
differentiates that with autograd, which runs the Function's own backward (as AOT Autograd does).

Dynamo records such a Function as one ``autograd_function_apply`` node with its forward and
backward as subgraphs; passkit's forward-only traces (``functionalize``, ``decompose``) run that
op below autograd, which inlines the forward. ``calls_custom_function`` finds such a node, and
capture keeps Dynamo's graph for ``joint`` in the same way.
"""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

import torch
from torch.fx import GraphModule

from passkit import _torch

__all__ = ["TapeObserver", "calls_custom_function", "made_by_function"]

# passkit's and torch's own Functions (checkpoint, generated ones): their backward is the
# derivative of their forward, so differentiating the forward is exact.
_DERIVATIVE_BACKWARDS = ("passkit.", "torch.")


def _custom_function(outputs: Sequence[Any]) -> str | None:
    seen: set[Any] = set()
    stack = [o.grad_fn for o in outputs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        forward_cls = getattr(node, "_forward_cls", None)
        if isinstance(node, torch.autograd.function.BackwardCFunction) and forward_cls is not None:
            if not forward_cls.__module__.startswith(_DERIVATIVE_BACKWARDS):
                return forward_cls.__qualname__
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return None


def made_by_function(value: Any, inputs: Sequence[Any]) -> bool:
    """Whether ``value`` came out of an ``autograd.Function`` (Python or C++), possibly viewed
    after: its gradient then passes the Function's backward even where it shares an input's
    memory (the Function returned its input), so the runtime must not make it again from the
    input (torch's ``custom_function_view``, which torch decides for the Function's own result
    only: ``Foo.apply(x).t()`` gets ``x``'s gradient there, not eager's).

    The walk follows each node's first input, the way a view or an in-place write goes back to
    the tensor it aliases, and stops at the inputs' own history.
    """
    node = value.grad_fn if isinstance(value, torch.Tensor) else None
    stops = {x.grad_fn for x in inputs if isinstance(x, torch.Tensor) and x.grad_fn is not None}
    while node is not None and node not in stops:
        if isinstance(node, torch.autograd.function.BackwardCFunction) or type(node).__name__ == "CppFunction":
            return True
        node = node.next_functions[0][0] if node.next_functions else None
    return False


class TapeObserver:
    """Look at a traced function's outputs while they still carry their autograd history."""

    def __init__(self) -> None:
        self.requires_grad: list[bool] | None = None
        self.custom_function: str | None = None  # the first user Function the outputs depend on
        self.made_by_function: list[bool] | None = None  # per output: an autograd.Function's result

    def observe(self, outputs: Sequence[Any], inputs: Sequence[Any] = ()) -> None:
        self.requires_grad = [isinstance(o, torch.Tensor) and o.requires_grad for o in outputs]
        self.made_by_function = [made_by_function(o, inputs) for o in outputs]
        if torch.is_grad_enabled() and self.custom_function is None:
            self.custom_function = _custom_function(outputs)


# Dynamo's node for a Function keeps no class, only the stack trace of the ``.apply`` call; its
# innermost frame says where the call is, so a call inside torch or passkit counts as theirs.
_APPLY_CALL = re.compile(r"([A-Za-z_][\w.]*)\.apply\(")
_FRAME_FILE = re.compile(r'File "([^"]+)"')
_OWN_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch,) if m.__file__) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
)


def _applied_function(stack_trace: str) -> str | None:
    """The Function a Dynamo ``autograd_function_apply`` node calls, or ``None`` for one of
    torch's or passkit's own."""
    files = _FRAME_FILE.findall(stack_trace)
    if files and os.path.abspath(files[-1]).startswith(_OWN_DIRS):
        return None
    names = _APPLY_CALL.findall(stack_trace)
    return names[-1] if names else "<unknown>"


def calls_custom_function(gm: GraphModule) -> bool:
    """Whether a graph from Dynamo calls a user's custom autograd.Function (at any depth)."""
    return any(
        node.op == "call_function"
        and getattr(node.target, "__name__", None) == "autograd_function_apply"
        and _applied_function(str(node.meta.get("stack_trace") or "")) is not None
        for graph in _torch.graph_and_subgraphs(gm)
        for node in graph.graph.nodes
    )
