"""Own what tracing a user function shows about autograd that the traced graph does not keep.

The graph records ops only. Two facts live on the autograd tape while the function runs:
which outputs require grad (``a.view(-1).requires_grad_()`` makes one without an op), and
whether a custom ``torch.autograd.Function`` ran. Such a Function's backward never reaches the
graph: ``joint`` would differentiate its forward instead, a silent wrong gradient, so capture
refuses it with one line (``on_error = "eager"`` then runs the function uncompiled).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from passkit.errors import PasskitError

__all__ = ["CUSTOM_FUNCTION_ERROR", "TapeObserver"]

CUSTOM_FUNCTION_ERROR = (
    "passkit: the program calls the custom torch.autograd.Function '{name}', whose own backward "
    "passkit cannot keep; call it outside the compiled function, or use on_error = \"eager\""
)

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


class TapeObserver:
    """Look at a traced function's outputs while they still carry their autograd history."""

    def __init__(self) -> None:
        self.requires_grad: list[bool] | None = None

    def observe(self, outputs: Sequence[Any]) -> None:
        self.requires_grad = [isinstance(o, torch.Tensor) and o.requires_grad for o in outputs]
        if torch.is_grad_enabled():
            name = _custom_function(outputs)
            if name is not None:
                raise PasskitError(CUSTOM_FUNCTION_ERROR.format(name=name))
