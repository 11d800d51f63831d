"""Own the random fills tracing must keep: ``t.bernoulli_(p)`` on a non-contiguous ``t``
functionalized into ``passkit::bernoulli_in_layout``, which draws into ``t``'s own layout as
eager does (``KeepRandomFillLayout``, the mode ``functional_trace`` runs under).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode

from passkit._torch.hops import forward_hop

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
        return func(*args, **kwargs)
