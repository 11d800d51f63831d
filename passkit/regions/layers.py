"""Own how the ``regions`` step finds layers: the nodes of each instance of a container item, what
it reads and returns, and a structural key that is equal for two layers that compute the same
thing.

The captured graph's nodes are grouped by the outermost indexed module on their
``nn_module_stack`` (``blocks.3``). A layer's key hashes its op targets, constants and wiring, and
each value's shape, stride, dtype and ``requires_grad``; operands may differ in
``requires_grad``. A layer cannot be outlined (``find_layers`` leaves it out) when it mutates a
value from outside, toggles grad mode or another global, carries ``recompute`` tags, takes or
returns something other than a tensor, or is not a contiguous piece of the graph's dependencies.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node

from passkit import _torch

__all__ = ["Layer", "container_label", "describe", "example_value", "find_layers", "is_region_call", "merged",
           "operands_needing_grad", "target_name"]

# One instance of a container's item: "L['self'].blocks.3" -> ("L['self'].blocks", "3").
_INDEXED = re.compile(r"^(?P<container>.+?)(?:\.|\[)(?P<index>\d+)\]?$")
# Calls whose effect is global state rather than a value: a layer holding one stays inline.
_GLOBAL_EFFECTS = ("_set_grad_enabled", "set_grad_enabled", "_enter_autocast", "_exit_autocast", "_record_function")


@dataclass
class Layer:
    """One instance of a container item: its nodes in graph order, operands and results."""

    path: str
    container: str
    kind: str
    nodes: list[Node] = field(default_factory=list)
    operands: list[Node] = field(default_factory=list)
    results: list[Node] = field(default_factory=list)
    key: str = ""


def _instance_of(node: Node) -> tuple[str, str, str] | None:
    """The outermost indexed module ``node`` belongs to: (path, container, class name)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    for path, kind in stack.values():
        match = _INDEXED.match(str(path))
        if match:
            return str(path), match.group("container"), getattr(kind, "__qualname__", str(kind))
    return None


def find_layers(gm: GraphModule) -> list[Layer]:
    """Every indexed layer of ``gm``'s top level, with its nodes, operands, results and key."""
    layers: dict[str, Layer] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        found = _instance_of(node)
        if found is None:
            continue
        path, container, kind = found
        layers.setdefault(path, Layer(path, container, kind)).nodes.append(node)
    usable = []
    for layer in layers.values():
        if describe(layer):
            usable.append(layer)
    return usable


def describe(layer: Layer) -> bool:
    """Fill the layer's operands, results and structural key; False if it cannot be outlined."""
    members = set(layer.nodes)
    if not _contiguous(layer, members):
        return False
    operands: dict[Node, int] = {}
    local: dict[Node, int] = {}
    parts: list[Any] = []

    def canon(arg: Any) -> Any:
        if isinstance(arg, Node):
            if arg in members:
                return ("n", local[arg])
            if arg not in operands:
                operands[arg] = len(operands)
            return ("in", operands[arg])
        if isinstance(arg, (list, tuple)):
            return (type(arg).__name__, tuple(canon(a) for a in arg))
        if isinstance(arg, dict):
            return ("dict", tuple(sorted((str(k), canon(v)) for k, v in arg.items())))
        if isinstance(arg, torch.Tensor):
            return ("tensor", id(arg))  # a constant tensor: equal only to itself
        return ("const", type(arg).__name__, repr(arg))

    for position, node in enumerate(layer.nodes):
        if not _outlinable(node, members):
            return False
        parts.append((node.op, target_name(node.target), canon(node.args), canon(node.kwargs), _value_key(node)))
        local[node] = position
    layer.operands = list(operands)
    layer.results = [node for node in layer.nodes if any(user not in members for user in node.users)]
    if not layer.results:
        return False
    for value in (*layer.operands, *layer.results):
        if not isinstance(example_value(value), torch.Tensor):
            return False
    parts.append(("operands", tuple(_operand_key(node) for node in layer.operands)))
    parts.append(("results", tuple(local[node] for node in layer.results)))
    layer.key = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
    return True


def _contiguous(layer: Layer, members: set[Node]) -> bool:
    """Whether no node outside the layer both reads one of its values and feeds one of its nodes."""
    order = list(layer.nodes[0].graph.nodes)
    first, last = order.index(layer.nodes[0]), order.index(layer.nodes[-1])
    downstream: set[Node] = set()
    for node in order[first : last + 1]:
        inputs = node.all_input_nodes
        if node in members:
            if any(value in downstream for value in inputs):
                return False
        elif any(value in members or value in downstream for value in inputs):
            downstream.add(node)
    return True


def _outlinable(node: Node, members: set[Node]) -> bool:
    if node.meta.get("recompute") is not None or node.op == "call_module":
        return False
    name = target_name(node.target)
    if any(effect in name for effect in _GLOBAL_EFFECTS):
        return False
    if is_region_call(node):
        return False  # the user's own region: keep it as it is
    if _torch.writes_in_place(node) and node.args and isinstance(node.args[0], Node) and node.args[0] not in members:
        return False
    return True


def target_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    return f"{module}.{name}" if module else str(name)


def example_value(node: Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def _value_key(node: Node, *, with_grad: bool = True) -> Any:
    value = example_value(node)
    if isinstance(value, torch.Tensor):
        grad = value.requires_grad if with_grad else None
        return ("t", tuple(value.shape), tuple(value.stride()), str(value.dtype), grad, str(value.device))
    if isinstance(value, (list, tuple)):
        return tuple(_value_key_of(v) for v in value)
    return _value_key_of(value)


def _operand_key(node: Node) -> Any:
    """An operand's key without ``requires_grad``: the first layer of a stack reads the model's
    input, which needs no grad, and still shares the body (``joint`` differentiates that operand
    in every call of the body, ``_torch.region_operands_differentiated``)."""
    return _value_key(node, with_grad=False)


def operands_needing_grad(layer: Layer) -> int:
    return sum(bool(getattr(example_value(operand), "requires_grad", False)) for operand in layer.operands)


def _value_key_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("t", tuple(value.shape), tuple(value.stride()), str(value.dtype), value.requires_grad)
    return type(value).__name__


def _index(layer: Layer) -> int:
    return int(_INDEXED.match(layer.path).group("index"))  # type: ignore[union-attr]


def merged(layers: list[Layer], size: int) -> list[Layer]:
    """``layers`` (one container, one key) with each ``size`` consecutive ones made one layer;
    a run that cannot be one (other nodes between them, say) and the last few stay single."""
    order = {node: i for i, node in enumerate(layers[0].nodes[0].graph.nodes)}
    ordered = sorted(layers, key=_index)
    result: list[Layer] = []
    start = 0
    while start < len(ordered):
        run = ordered[start:start + size]
        consecutive = len(run) == size and all(_index(b) == _index(a) + 1 for a, b in zip(run, run[1:]))
        if consecutive:
            first, last = run[0], run[-1]
            joined = Layer(f"{first.path}-{_index(last)}", first.container, f"{first.kind} x{size}",
                           sorted((n for layer in run for n in layer.nodes), key=order.__getitem__))
            if describe(joined):
                result.append(joined)
                start += size
                continue
        result.append(ordered[start])
        start += 1
    return result


def is_region_call(node: Node) -> bool:
    """Whether ``node`` calls a body (``invoke_subgraph``), the user's or passkit's."""
    return _torch.is_higher_order(node.target) and target_name(node.target).endswith("invoke_subgraph")


# Dynamo's name for the model in the frame it traces: ``L['self']``, or ``L['args'][0]`` when a
# decorator wraps ``forward`` (Hugging Face's ``can_return_tuple``) and the frame is the wrapper's.
_DYNAMO_ROOT = re.compile(r"^L\[[^\]]+\](?:\[\d+\])*\.?")


def container_label(container: str) -> str:
    """``container`` as the model names it: ``L['args'][0].model.layers`` -> ``model.layers``."""
    return _DYNAMO_ROOT.sub("", container) or container
