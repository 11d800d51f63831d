"""Own what ``partition.min_cut`` knows about each joint-graph value: its bytes and its run time.

Bytes are those of the storage a value keeps alive: a view (``view``, ``permute``, a piece of
``split``) keeps its base's whole storage, so it is charged the base's bytes. Symbolic sizes use
their hints.

Run time comes from one of two estimators:

- ``flops``: ``max(flops / peak, bytes moved / bandwidth) + per-op overhead``, with peak rates
  per device type. FLOPs come from ``torch.utils.flop_counter``'s formulas; ops without one are
  memory-bound.
- ``profile``: each op runs on the program's device, with real tensors of the recorded shapes,
  strides and dtypes, and the best of a few runs is kept. Timings are cached per op, argument
  shapes and device for the life of the process, so each distinct op is measured once. On a
  GPU an op is timed with CUDA events around several back-to-back runs (the kernel's time,
  not the launch's); an op whose made-up tensors would take more than
  ``PROFILE_MEMORY_LIMIT`` bytes is estimated by ``flops`` instead, so compiling never takes
  the memory a training step needs.

Views, ``getitem`` and other aliasing ops cost nothing to recompute under both estimators. With
``fused_pointwise`` (a code generator that fuses, such as ``codegen.inductor``), pointwise ops cost
nothing either: recomputed in the backward they fuse into the kernel that reads their inputs,
which the backward reads in place of their output. So do factories that read no tensor
(``arange``, ``full``, ``iota``): the generator computes their values from indices inside the
kernel that reads them. Not when a matmul, convolution or attention reads them: a library kernel
needs its input written out, so recomputing costs a kernel's time. (Random ops never reach an
estimator: the min-cut's rules save them.)
"""

from __future__ import annotations

import operator
import time
from typing import Any, Callable, Literal

import torch
from torch.fx import Node
from torch.utils.flop_counter import flop_registry

from passkit import _torch

__all__ = ["storage_root", "node_bytes", "Estimator", "estimator_for", "clear_profile_cache"]

EstimatorName = Literal["flops", "profile"]

# Peak figures per device type: FLOP/s, bytes/s, seconds of overhead per op call. A GPU's
# FLOP/s are its tensor cores' for 16-bit floats (an H100/H200 sustains about 8e14 in bf16) and
# about a tenth of that for 32-bit ones (TF32 aside).
_RATES: dict[str, tuple[float, float, float]] = {
    "cpu": (5e10, 1e10, 3e-6),
    "cuda": (8e14, 3e12, 6e-6),
}
_WIDE_FLOAT_SLOWDOWN = {"cuda": 10.0}
PROFILE_MEMORY_LIMIT = 256 * 2**20
_PROFILE_REPEATS = 3
_GPU_REPEATS = 10
# Ops torch's FLOP counter has no formula for, counted by the formula of an op with the same
# arguments and work: the CPU's fused attention is the flash kernel's math on the CPU.
_SAME_FLOPS_AS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: torch.ops.aten._scaled_dot_product_flash_attention,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
        torch.ops.aten._scaled_dot_product_flash_attention_backward,
}
_profile_cache: dict[tuple[Any, ...], float] = {}


def _hint(value: Any) -> int:
    return int(value) if isinstance(value, int) else _torch.size_hint(value)


def _tensor_bytes(value: torch.Tensor) -> int:
    numel = 1
    for size in value.shape:
        numel *= _hint(size)
    return numel * value.element_size()


def _aliases_input(node: Node) -> bool:
    """Whether the node's value is a view of its first input (so it shares that storage)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, Node) and _aliases_input(source)
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns:
        return False
    alias = schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def storage_root(node: Node) -> Node:
    """The node whose storage ``node``'s value lives in (itself unless it is a view)."""
    while _aliases_input(node) and isinstance(node.args[0], Node):
        node = node.args[0]
    return node


def node_bytes(node: Node) -> int:
    """Bytes that keeping ``node``'s value alive costs: its storage root's size."""
    value = storage_root(node).meta.get("val")
    if isinstance(value, torch.Tensor):
        return _tensor_bytes(value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, int, float)):
        return 8
    return 0


def is_free(node: Node) -> bool:
    """Ops that only re-describe memory: nothing to recompute."""
    return node.op != "call_function" or _aliases_input(node) or node.target is operator.getitem


def is_pointwise(node: Node) -> bool:
    """Elementwise ATen ops (``torch.Tag.pointwise``), which a fusing code generator inlines."""
    return node.op == "call_function" and torch.Tag.pointwise in getattr(node.target, "tags", ())


def reads_no_tensor(node: Node) -> bool:
    """A factory (``arange``, ``full``, ``iota``, ...): its value comes from its arguments alone."""
    return node.op == "call_function" and not any(
        isinstance(arg.meta.get("val"), torch.Tensor) for arg in node.all_input_nodes
    )


def feeds_a_library_kernel(node: Node) -> bool:
    """Whether a matmul, convolution or attention (an op with a FLOP formula, which code
    generators call as a library kernel rather than fuse) reads ``node``'s value: recomputed,
    the value must be written out for it, a kernel of its own."""
    return any(
        user.op == "call_function" and getattr(user.target, "overloadpacket", None) in _FLOP_FORMULAS
        for user in node.users
    )


def _values(args: Any) -> list[Any]:
    flat, _ = _torch.pytree.tree_flatten(args)
    return flat


def _meta_args(node: Node) -> tuple[Any, Any]:
    def value(arg: Any) -> Any:
        return arg.meta.get("val") if isinstance(arg, Node) else arg

    return _torch.pytree.tree_map(value, (node.args, node.kwargs))


def _device_of(node: Node) -> torch.device:
    for value in _values(_meta_args(node)) + _values(node.meta.get("val")):
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


class Estimator:
    """Estimated seconds to run one joint-graph node again."""

    name: str = "?"
    fused_pointwise: bool = False

    def __call__(self, node: Node) -> float:
        fusible = is_pointwise(node) or reads_no_tensor(node)
        if is_free(node) or (self.fused_pointwise and fusible and not feeds_a_library_kernel(node)):
            return 0.0
        return self.seconds(node)

    def seconds(self, node: Node) -> float:
        raise NotImplementedError


_FLOP_FORMULAS = {*flop_registry, *_SAME_FLOPS_AS}


class FlopsEstimator(Estimator):
    name = "flops"

    def seconds(self, node: Node) -> float:
        device = _device_of(node).type
        peak, bandwidth, overhead = _RATES.get(device, _RATES["cpu"])
        args, kwargs = _meta_args(node)
        out = node.meta.get("val")
        if any(isinstance(v, torch.Tensor) and v.dtype in (torch.float32, torch.float64) for v in _values(out)):
            peak /= _WIDE_FLOAT_SLOWDOWN.get(device, 1.0)
        moved = sum(_tensor_bytes(v) for v in _values((args, kwargs, out)) if isinstance(v, torch.Tensor))
        flops = 0
        packet = getattr(node.target, "overloadpacket", None)
        formula = flop_registry.get(_SAME_FLOPS_AS.get(packet, packet))
        if formula is not None:
            try:
                flops = _hint(formula(*args, **kwargs, out_val=out))
            except Exception:  # a formula that cannot read symbolic shapes: memory-bound instead
                flops = 0
        return max(flops / peak, moved / bandwidth) + overhead


def _real(value: Any, device: torch.device) -> Any:
    """A real tensor shaped like a recorded value; integers are zeros, so any index is valid."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _torch.size_hint(value)
    if not isinstance(value, torch.Tensor):
        return value
    shape = [_hint(s) for s in value.shape]
    stride = [_hint(s) for s in value.stride()]
    real = torch.empty_strided(shape, stride, dtype=value.dtype, device=device)
    if value.dtype.is_floating_point or value.dtype.is_complex:
        return real.normal_()
    return real.zero_()


def _signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("T", tuple(_hint(s) for s in value.shape), tuple(_hint(s) for s in value.stride()), str(value.dtype))
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _torch.size_hint(value)
    return repr(value)


class ProfileEstimator(Estimator):
    name = "profile"

    def __init__(self) -> None:
        self.fallback = FlopsEstimator()
        self.measured = 0

    def seconds(self, node: Node) -> float:
        args, kwargs = _meta_args(node)
        device = _device_of(node)
        made_up = sum(_tensor_bytes(v) for v in _values((args, kwargs, node.meta.get("val"))) if isinstance(v, torch.Tensor))
        if made_up > PROFILE_MEMORY_LIMIT:
            return self.fallback.seconds(node)
        key = (str(node.target), device.type, _torch.pytree.tree_map(_signature, (args, kwargs)).__repr__())
        if key not in _profile_cache:
            timing = self._time(node.target, args, kwargs, device)
            if timing is None:
                return self.fallback.seconds(node)
            _profile_cache[key] = timing
            self.measured += 1
        return _profile_cache[key]

    @staticmethod
    def _time(target: Callable[..., Any], args: Any, kwargs: Any, device: torch.device) -> float | None:
        with _torch.no_fake_mode():
            try:
                real_args, real_kwargs = _torch.pytree.tree_map(lambda v: _real(v, device), (args, kwargs))
                with torch.no_grad():
                    target(*real_args, **real_kwargs)  # the first run pays one-time costs
                    if device.type == "cuda":
                        return _gpu_seconds(lambda: target(*real_args, **real_kwargs), device)
                    best = float("inf")
                    for _ in range(_PROFILE_REPEATS):
                        started = time.perf_counter()
                        target(*real_args, **real_kwargs)
                        best = min(best, time.perf_counter() - started)
                return best
            except Exception:  # an op that cannot run on made-up data: use the flops model
                return None


def _gpu_seconds(run: Callable[[], Any], device: torch.device) -> float:
    """A GPU op's kernel time: back-to-back runs recorded in one CUDA graph and timed with CUDA
    events around its second replay. Launched one by one from Python, a small op's launches cost
    more host time than its kernel takes, so the events timed the host: 25 us for a 16-element
    add on the H200 machine. An op that cannot be captured is timed launch by launch."""
    with torch.cuda.device(device):
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                for _ in range(_GPU_REPEATS):
                    run()
        except Exception:  # a syncing op (nonzero, item) refuses capture
            graph = None
        if graph is not None:
            graph.replay()  # the first replay uploads the graph to the device
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        if graph is not None:
            graph.replay()
        else:
            for _ in range(_GPU_REPEATS):
                run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / _GPU_REPEATS


def estimator_for(name: EstimatorName, *, fused_pointwise: bool = False) -> Estimator:
    estimator = ProfileEstimator() if name == "profile" else FlopsEstimator()
    estimator.fused_pointwise = fused_pointwise
    return estimator


def clear_profile_cache() -> None:
    """Forget every measured timing (tests use this to see ops being measured)."""
    _profile_cache.clear()


def profile_cache_size() -> int:
    return len(_profile_cache)
