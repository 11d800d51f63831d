"""Own the random fills tracing must keep: ``t.bernoulli_(p)`` on a non-contiguous ``t``
functionalized into ``passkit::bernoulli_in_layout``, which draws into ``t``'s own layout as
eager does, and composite ops (dropout) inside a higher-order op's body decomposed as eager
decomposes them (``KeepRandomFillLayout``, the mode ``functional_trace`` runs under).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C import DispatchKey
from torch._ops import HigherOrderOperator
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from passkit._torch.hops import forward_hop
from passkit._torch.values import is_traced_value

__all__ = ["BERNOULLI_IN_LAYOUT", "KeepRandomFillLayout"]


@torch.library.custom_op(
    "passkit::bernoulli_in_layout", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def _bernoulli_in_layout(self: torch.Tensor, p: float) -> torch.Tensor:
    return torch.empty_strided(self.size(), self.stride(), dtype=self.dtype, device=self.device).bernoulli_(p)


@_bernoulli_in_layout.register_fake
def _(self: torch.Tensor, p: float) -> torch.Tensor:
    return torch.empty_strided(self.size(), self.stride(), dtype=self.dtype, device=self.device)


BERNOULLI_IN_LAYOUT = torch.ops.passkit.bernoulli_in_layout.default


class KeepRandomFillLayout(TorchDispatchMode):
    """Functionalize ``t.bernoulli_(p)`` on a non-contiguous ``t`` without changing its draws.

    Its functional form ``bernoulli.p`` fills a new contiguous tensor, in logical order; the
    in-place op on ``t`` fills ``t``'s own layout, in memory order on some CPUs (eager dropout
    draws into ``empty_like`` of a transposed activation). ``passkit::bernoulli_in_layout``
    runs the in-place op on a fresh tensor of ``t``'s strides, so it draws what eager draws.
    The other in-place random ops' functional forms clone ``t`` and keep its layout already.

    A composite op (dropout, attention) reaches the mode whole only inside a higher-order op's
    body (``invoke_subgraph``), which torch traces with autograd below it. Functionalization
    would then decompose it with torch's Python decomposition where one exists, and the ops it
    decomposes into would pass the mode by. Dropout became ATen's ``native_dropout``: the same
    draws, but a kernel the graph around does not run (GPT-2's bodies stepped 5% slower than its
    layers inline). The mode runs ATen's C++ decomposition instead, as eager and the graph
    around the body do (dropout: ``bernoulli_`` and a scale Inductor fuses on the CPU;
    ``native_dropout`` where ATen fuses it, on CUDA).
    """

    # Higher-order ops (cond, while_loop, flex_attention, ...) come here too, rather than failing
    # for want of a rule: torch's own modes that watch ops (FlopCounterMode, DebugMode) do the same.
    supports_higher_order_operators = True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, HigherOrderOperator):
            return forward_hop(self, func, args, kwargs)
        if func is torch.ops.aten.bernoulli_.float and kwargs.get("generator") is None:
            target = args[0]
            if target.layout == torch.strided and not target.is_contiguous():
                p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
                return target.copy_(BERNOULLI_IN_LAYOUT(target, p))
        if _decomposed_by_aten(func) and not _subclass_in(args, kwargs):
            with self:  # the ops it decomposes into come back here, as in the graph around
                return func._op_dk(DispatchKey.CompositeImplicitAutograd, *args, **kwargs)
        return func(*args, **kwargs)


def _subclass_in(args: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a tensor subclass with its own dispatch (a jagged NestedTensor built inside the
    program) takes part: it has its own rule for the composite op, and ATen's decomposition
    would hand the op back to it, without end."""
    return any(
        isinstance(a, torch.Tensor) and type(a).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__
        and not is_traced_value(a)
        for a in pytree.tree_leaves((args, kwargs))
    )


def _decomposed_by_aten(func: Any) -> bool:
    """Whether ``func`` reached the mode whole where autograd would have decomposed it with
    ATen's C++ kernel: a composite op, traced without the Python dispatcher (which prefers
    torch's Python decompositions, in the graph around too)."""
    return (isinstance(func, torch._ops.OpOverload)
            and not torch._C._dispatch_tls_is_dispatch_key_included(DispatchKey.PythonDispatcher)
            and torch._C._dispatch_has_kernel(func.name())  # not prim::device and the like
            and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), DispatchKey.CompositeImplicitAutograd))
