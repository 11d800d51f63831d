"""Own outlined regions' results in the graph around them: example values of each call's own,
and operands read directly rather than through a result that passes them on.

When torch splits a body into forward and backward (``run_joint_graph_passes_on_hops``), it
gives each rewired ``invoke_subgraph`` call, and the ``getitem`` that reads each saved value, the
example values (``meta["val"]``) of the body's own output node. Every call of one body then
shares the same fake tensor objects: the saved mask of layer 1 and of layer 3 are one object.
torch's AOT path never traces those graphs again, but passkit does (``codegen.inductor``
re-traces a graph through Inductor's decompositions on its placeholders' values), and
``make_fx`` knows a value by its identity: every backward call then read the saved values of
the last forward call, and dropout's gradients came out with another layer's mask.
``region_results_of_their_own`` gives each call values of its own, aliasing what the body's
results alias: a result that is (a view of) an operand is a view of that call's operand, and the
others get fresh storage, so the storage checks that decide donation stay right too.

The split body also returns some operands as saved values unchanged (the layer's input, its
weight) or through views (the weight's ``permute``). Inductor takes every region result for a
buffer of its own, so with buffer reuse on it could write a later buffer over such a result.
``operands_read_directly`` has every reader of one read the operand itself, through the same
views, and ``region_results_alias_operands`` says whether a graph still reads a region result
that shares an operand's memory (where buffer reuse must stay off).
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.multiprocessing.reductions import StorageWeakRef

from passkit._torch.hops import graph_and_subgraphs

__all__ = ["operands_read_directly", "region_results_alias_operands", "region_results_of_their_own"]


def _storage(value: Any) -> Any:
    return StorageWeakRef(value.untyped_storage()) if isinstance(value, torch.Tensor) else None


def _fake_mode(values: list[Any]) -> Any:
    from torch._subclasses.fake_tensor import FakeTensor

    return next((v.fake_mode for v in values if isinstance(v, FakeTensor)), None)


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and tuple(a.stride()) == tuple(b.stride())
            and a.storage_offset() == b.storage_offset())


def _view_like(base: torch.Tensor, like: torch.Tensor, offset: Any = 0) -> torch.Tensor:
    """``like``'s layout on ``base``'s storage, its offset moved by ``offset`` (``base`` itself
    when they match)."""
    if offset == 0 and _same_layout(base, like):
        return base
    if base.dtype == like.dtype:
        return base.as_strided(like.shape, like.stride(), like.storage_offset() + offset)
    return _on_storage(base.untyped_storage(), like, offset * base.element_size() // like.element_size())


def _on_storage(storage: Any, like: torch.Tensor, offset: Any = 0) -> torch.Tensor:
    """A tensor laid out as ``like`` on ``storage`` (a reinterpreting view keeps its dtype)."""
    empty = torch.empty(0, dtype=like.dtype, device=like.device)
    return empty.set_(storage, like.storage_offset() + offset, like.shape, like.stride())


def _call_results(body: GraphModule, operands: list[Any]) -> list[Any] | None:
    """This call's own example values for the body's results, or None where the body's outputs
    carry no tensor values to copy."""
    placeholders = [n.meta.get("val") for n in body.graph.nodes if n.op == "placeholder"]
    output = next(n for n in reversed(body.graph.nodes) if n.op == "output")
    outputs = [n.meta.get("val") if isinstance(n, Node) else None for n in output.args[0]]
    fake_mode = _fake_mode([*outputs, *operands])
    if fake_mode is None or len(placeholders) != len(operands):
        return None
    # A result on an operand's storage is that operand (or a view of it) in this call too; its
    # offset is counted from where this call's operand starts, not the body's own placeholder.
    operand_by_storage: dict[Any, tuple[torch.Tensor, torch.Tensor]] = {}
    for inner, outer in zip(placeholders, operands):
        storage = _storage(inner)
        if storage is not None and isinstance(outer, torch.Tensor):
            operand_by_storage.setdefault(storage, (inner, outer))
    sharing = Counter(_storage(value) for value in outputs)
    fresh_by_storage: dict[Any, torch.Tensor] = {}
    results: list[Any] = []
    with fake_mode:
        for value in outputs:
            storage = _storage(value)
            if storage is None:
                results.append(value)  # SymInts and None: no identity to share
            elif storage in operand_by_storage:
                inner, outer = operand_by_storage[storage]
                if value is inner or _same_layout(value, inner):
                    results.append(outer)
                else:
                    results.append(_view_like(outer, value, outer.storage_offset() - inner.storage_offset()))
            elif storage in fresh_by_storage:
                results.append(_view_like(fresh_by_storage[storage], value))
            else:
                fresh = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)
                if value.storage_offset() != 0 or sharing[storage] > 1:  # room for every view of it
                    whole = torch.empty(value.untyped_storage().nbytes(), dtype=torch.uint8, device=value.device)
                    fresh = _on_storage(whole.untyped_storage(), value)
                fresh_by_storage[storage] = fresh
                results.append(fresh)
    return results


def region_results_of_their_own(gm: GraphModule) -> int:
    """Give every ``invoke_subgraph`` call in ``gm`` (and in its bodies) example values of its
    own where it shares its body's output values (see the module); returns how many values
    were replaced."""
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    replaced = 0
    for graph_module in graph_and_subgraphs(gm):
        for node in graph_module.graph.nodes:
            if node.op != "call_function" or node.target is not hop or not isinstance(node.args[0], Node):
                continue
            body = getattr(graph_module, node.args[0].target)
            output = next(n for n in reversed(body.graph.nodes) if n.op == "output")
            shared = [n.meta.get("val") if isinstance(n, Node) else None for n in output.args[0]]
            values = node.meta.get("val")
            if not isinstance(values, (tuple, list)) or not any(
                    isinstance(v, torch.Tensor) and any(v is s for s in shared) for v in values):
                continue
            operands = [a.meta.get("val") if isinstance(a, Node) else a for a in node.args[2:]]
            own = _call_results(body, operands)
            if own is None or len(own) != len(values):
                continue
            merged = [mine if isinstance(v, torch.Tensor) and v is shared[k] else v
                      for k, (v, mine) in enumerate(zip(values, own))]
            node.meta["val"] = type(values)(merged)
            for user in node.users:
                if user.target is operator.getitem and isinstance(user.args[1], int):
                    k = user.args[1]
                    current = user.meta.get("val")
                    if isinstance(current, torch.Tensor) and current is shared[k]:
                        user.meta["val"] = merged[k]
                        replaced += 1
    return replaced


def _calls(gm: GraphModule) -> list[tuple[GraphModule, Node, GraphModule]]:
    """Every ``invoke_subgraph`` call in ``gm`` at any depth: the graph holding it, the call and
    its body."""
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    return [
        (graph_module, node, getattr(graph_module, node.args[0].target))
        for graph_module in graph_and_subgraphs(gm)
        for node in graph_module.graph.nodes
        if node.op == "call_function" and node.target is hop and isinstance(node.args[0], Node)
    ]


def _body_outputs(body: GraphModule) -> list[Any]:
    return list(next(n for n in reversed(body.graph.nodes) if n.op == "output").args[0])


def _view_chain(result: Any, placeholders: list[Node]) -> tuple[Node, list[Node]] | None:
    """The placeholder ``result`` is, or a view of through ATen view ops whose other arguments
    are constants, with those views from the placeholder outwards; None for anything else."""
    chain: list[Node] = []
    while isinstance(result, Node) and result not in placeholders:
        read: list[Node] = []
        torch.fx.node.map_arg((result.args[1:], result.kwargs), read.append)
        if result.op != "call_function" or not getattr(result.target, "is_view", False) or read or not result.args:
            return None
        chain.append(result)
        result = result.args[0]
    return (result, chain[::-1]) if isinstance(result, Node) else None


def _outer_view(graph_module: GraphModule, view: Node, base: Node) -> Node:
    """``view`` applied to ``base`` in the graph around the body, with its example value."""
    node = graph_module.graph.call_function(view.target, (base, *view.args[1:]), dict(view.kwargs))
    base_value = base.meta.get("val")
    fake_mode = _fake_mode([base_value])
    if fake_mode is not None:
        with fake_mode:
            node.meta["val"] = view.target(base_value, *view.args[1:], **view.kwargs)
    return node


def operands_read_directly(gm: GraphModule) -> int:
    """Have every reader of a region result that is one of the call's operands, or a view of
    one, read that operand (through the same views) instead (see the module); returns how many
    results were rewired."""
    rewired = 0
    for graph_module, node, body in _calls(gm):
        placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
        outputs = _body_outputs(body)
        for user in list(node.users):
            if user.target is not operator.getitem or not isinstance(user.args[1], int):
                continue
            found = _view_chain(outputs[user.args[1]], placeholders)
            if found is None or not isinstance(operand := node.args[2 + placeholders.index(found[0])], Node):
                continue
            value = operand
            with graph_module.graph.inserting_before(user):
                for view in found[1]:
                    value = _outer_view(graph_module, view, value)
            user.replace_all_uses_with(value)
            graph_module.graph.erase_node(user)
            rewired += 1
    return rewired


def region_results_alias_operands(gm: GraphModule) -> bool:
    """Whether ``gm`` reads a region result that shares memory with one of the body's inputs
    (or may: a value without an example counts as sharing)."""
    for _, node, body in _calls(gm):
        placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
        inputs = {_storage(n.meta.get("val")) for n in placeholders}
        outputs = _body_outputs(body)
        for user in node.users:
            if user.target is not operator.getitem or not isinstance(user.args[1], int):
                return True  # the results read whole: no telling which
            if not user.users or not isinstance(result := outputs[user.args[1]], Node):
                continue
            if result in placeholders or None in inputs or "val" not in result.meta:
                return True
            if _storage(result.meta["val"]) in inputs:
                return True
    return False
