"""Own constant evaluation: the real value of a node that depends on no graph input.

Masks built in the model (``torch.ones(s, s).tril()``) and scales written as tensors
(``torch.full([], 8.0)``) are constants of the graph. Patterns evaluate them at rewrite time to
prove a property (this mask is causal, this scale is 0.125) instead of assuming it.

A value is computed on the device the graph records, so a folded scale is the one that device
would compute. A graph traced for a device this machine lacks (fake CUDA tensors on a CPU-only
machine: the GPU path's own tests) is evaluated on the CPU instead; callers compare values on the
value's own device.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from passkit import _torch

__all__ = ["constant_value", "is_constant"]

_LIMIT_ELEMENTS = 1 << 22  # evaluate masks and scales, never a whole weight-sized computation


def _ancestry(node: Node) -> list[Node] | None:
    seen: dict[Node, None] = {}
    stack = [node]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        if current.op != "call_function":
            return None
        if _torch.mutates(current) or _torch.call_draws_random_numbers(current):
            return None
        val = current.meta.get("val")
        if isinstance(val, torch.Tensor) and val.numel() > _LIMIT_ELEMENTS:
            return None
        seen[current] = None
        stack.extend(current.all_input_nodes)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def is_constant(node: Any) -> bool:
    """Whether ``node`` is computed from literals only (no inputs, no randomness, small)."""
    return isinstance(node, Node) and _ancestry(node) is not None


def constant_value(node: Any) -> Any:
    """The real value of a constant node, or None when it is not a constant."""
    if not isinstance(node, Node):
        return node
    ancestry = _ancestry(node)
    if ancestry is None:
        return None
    values: dict[Node, Any] = {}
    for current in ancestry:
        args, kwargs = _torch.pytree.tree_map(
            lambda a: values[a] if isinstance(a, Node) else _runnable(a), (current.args, current.kwargs)
        )
        values[current] = current.target(*args, **kwargs)
    return values[node]


def _runnable(argument: Any) -> Any:
    """A device argument this machine has, as it is; one it lacks, the CPU."""
    if isinstance(argument, torch.device) and argument.type != "cpu":
        module = getattr(torch, argument.type, None)
        available = getattr(module, "is_available", None)
        if not (callable(available) and available()):
            return torch.device("cpu")
    return argument
