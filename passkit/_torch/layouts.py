"""Own the layouts that re-tracing must keep: a decomposed value laid out as the op it replaces
recorded it (``with_layout``), graphs re-run that way (``LayoutKeepingInterpreter``), and outlined
region bodies handed to torch as functions that do the same (``bodies_keeping_layout``).

A graph traced before decomposing holds ``view`` nodes valid only for the strides each op
recorded; a decomposition may return other strides (torch's CPU flash attention, Inductor's
``cat`` of an empty past and one tensor), so every value is re-laid out to the recorded strides.

A body handed to ``invoke_subgraph`` wrapped in a plain function defeats the fake-tensor cache
(torch bypasses it for any function argument), so each of a region's calls ran its whole body
again on fake tensors just to learn the shapes of its results: 47 body runs per trace at 48
layers. The wrapper here is torch's ``SubgraphCallableWrapper`` where torch has it, which the
cache keys by the body it wraps, so one run serves every call with the same operands' metadata.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.fx import GraphModule
from torch.fx import traceback as fx_traceback

from passkit._torch.hops import call_keeping_whole

__all__ = ["LayoutKeepingInterpreter", "bodies_keeping_layout", "with_layout"]

try:  # torch 2.13 has it: a callable the fake-tensor cache keys by the subgraph it wraps
    from torch._higher_order_ops.utils import SubgraphCallableWrapper as _CacheableWrapper
except ImportError:  # pragma: no cover - a torch without it: every call runs the body (as before)
    _CacheableWrapper = None


def _prims_common() -> Any:
    import torch._prims_common as prims_common

    return prims_common


def _is_dense(value: torch.Tensor) -> bool:
    prims_common = _prims_common()
    check = getattr(prims_common, "is_non_overlapping_and_dense_or_false", None)
    if check is None:  # torch 2.11
        check = prims_common.is_non_overlapping_and_dense
    return bool(check(value))


def with_layout(value: Any, expected: Any) -> Any:
    """``value`` laid out like ``expected`` (same values), when the two differ and that is possible.

    A decomposition may return a tensor whose strides differ from those of the op it replaces:
    torch's own for the CPU flash attention lays its output out as (L, N, H, E) where the op
    returns ``empty_like(query)``. A graph traced before decomposing holds ``view`` nodes that
    are valid only for the op's own strides, so the decomposed value is re-laid out (permute,
    contiguous, permute back: Core ATen ops) to the strides the graph recorded.
    """
    if not isinstance(value, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return value
    if value.dim() != expected.dim() or value.dim() < 2:
        return value
    prims_common = _prims_common()
    same, _ = prims_common.check_significant_strides(value, expected, only_cuda=False)
    if same or not _is_dense(expected):
        return value
    perm = prims_common.compute_elementwise_output_logical_to_physical_perm(expected)
    if isinstance(perm, tuple):  # (perm, ambiguous) since torch 2.6; a bare list before
        perm = perm[0]
    inverse = prims_common.invert_perm(perm)
    return value.permute(perm).contiguous().permute(inverse)


class LayoutKeepingInterpreter(torch.fx.Interpreter):
    """Run a graph whose nodes carry ``val`` and keep every value's strides as recorded.

    Used when re-tracing through decompositions: see ``with_layout``. Higher-order ops stay
    whole (``call_keeping_whole``): re-tracing records no autograd rule.
    """

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        return call_keeping_whole(target, bodies_keeping_layout(target, args), kwargs)

    def run_node(self, n: torch.fx.Node) -> Any:
        value = super().run_node(n)
        if n.op == "call_function" and isinstance(value, torch.Tensor):
            return with_layout(value, n.meta.get("val"))
        return value


class _LayoutKeepingBody(torch.fx.Interpreter):
    """Run a body under autograd, each value laid out as the body recorded it."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        return super().call_function(target, bodies_keeping_layout(target, args), kwargs)

    def run_node(self, n: torch.fx.Node) -> Any:
        value = super().run_node(n)
        if n.op == "call_function":
            return with_layout(value, n.meta.get("val"))
        return value


def bodies_keeping_layout(target: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` of an FX call with an ``invoke_subgraph`` body replaced by a callable that runs
    it keeping each value's recorded strides; other calls' ``args`` as they are.

    ``joint`` lowers ops with their own autograd formula as it differentiates, and a
    decomposition may lay a value out otherwise than the op the body recorded (Inductor's
    ``cat`` of an empty past and one tensor returns that tensor's transposed strides), while the
    body's ``view`` nodes rely on the recorded layout (see ``with_layout``). The callable keeps
    the body reachable as ``__wrapped__`` (``_torch.regions`` reads it).
    """
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    if hop is None or target is not hop or not args or not isinstance(args[0], GraphModule):
        return args
    return (_layout_keeping(args[0]), *args[1:])


def _layout_keeping(body: GraphModule) -> Any:
    def run(*operands: Any) -> Any:
        if not fx_traceback.has_preserved_node_meta():
            return _LayoutKeepingBody(body).run(*operands)
        with fx_traceback.preserve_node_meta():  # the body's stack traces reach the joint graph
            return _LayoutKeepingBody(body).run(*operands)

    run.__wrapped__ = body  # type: ignore[attr-defined]
    if _CacheableWrapper is None:
        return run
    return _LayoutKeepingCall(run, body)


if _CacheableWrapper is not None:

    class _LayoutKeepingCall(_CacheableWrapper):  # type: ignore[misc, valid-type]
        """The layout-keeping run of one body, as a callable the fake-tensor cache can key.

        The key is the body and this kind of run, so a cached result is never that of a plain
        run of the same body (whose strides may differ).
        """

        def __init__(self, fn: Any, body: GraphModule) -> None:
            super().__init__(fn, body)
            self.__wrapped__ = body

        def __hash__(self) -> int:
            return hash(("passkit.layout_keeping", id(self.subgraph)))

        def __eq__(self, other: object) -> bool:
            return isinstance(other, _LayoutKeepingCall) and other.subgraph is self.subgraph
