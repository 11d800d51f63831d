"""Own what a value handed to compiled code is: a real plain tensor, or something compiled
kernels must never read (a fake, functional or meta tensor, a tensor subclass), and whether a
trace is recording the call.

Compiled kernels read data pointers directly, so one of these values reaching them takes the
process down; callers use these tests to refuse it in one line, or to let a trace run the
uncompiled function instead.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ["PLAIN_TENSOR_TYPES", "is_traced_value", "tracing_active", "unreadable_kind"]

# Exact types whose instances are real tensors with their own data (the per-call fast path).
PLAIN_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})


def tracing_active() -> bool:
    """Whether a call now is being recorded rather than run: a dispatch mode (make_fx,
    ``FakeTensorMode``, functionalization) is active, or Dynamo is tracing."""
    return _get_current_dispatch_mode() is not None or torch.compiler.is_compiling()


def is_traced_value(value: Any) -> bool:
    """Whether ``value`` is a tracer's stand-in (a fake or functional tensor), not data."""
    return isinstance(value, (FakeTensor, FunctionalTensor)) or (
        isinstance(value, torch.Tensor) and torch._is_functional_tensor(value)
    )


def unreadable_kind(value: Any) -> str | None:
    """What makes ``value`` unreadable by compiled kernels, or None for a real tensor (or a
    non-tensor). Plain Python subclasses without ``__torch_dispatch__`` hold real data."""
    if not isinstance(value, torch.Tensor):
        return None
    if isinstance(value, FakeTensor):
        return "a fake tensor"
    if is_traced_value(value):
        return "a functional tensor (it is being traced)"
    if type(value) not in PLAIN_TENSOR_TYPES and type(value).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        return f"a {type(value).__name__}, a tensor subclass"
    if value.is_meta:
        return "a meta tensor"
    return None
