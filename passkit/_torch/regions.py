"""Own what outlined regions (``invoke_subgraph`` bodies called many times) need from torch: one
schema per body, and each differentiated body split into forward and backward once.

torch derives ``invoke_subgraph``'s schema (which operands it mutates or aliases) by tracing its
body again, on every call: its autograd key does so before each differentiated call, and its
functionalization rule keys its own cache on the identity of the callable, which passkit wraps
afresh for each call. With one body called 24 times that is 24 traces of the body in
``functionalize`` and 24 more in ``joint``. The schema depends only on the body and on the
operands' types, shapes, strides, dtypes and ``requires_grad``, so ``remember_region_schemas``
keeps one per (body, identifier, operands' metadata), the body held weakly.

``joint`` lowers ops with their own autograd formula as it differentiates, and a decomposition
may lay a value out otherwise than the op the body recorded (Inductor's ``cat`` of an empty
past and one tensor returns that tensor's transposed strides), while the body's ``view`` nodes
rely on the recorded layout. ``bodies_keeping_layout`` hands torch each body as a function that
keeps every value's recorded strides, as ``joint`` already does for the graph around it.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torch.fx import traceback as fx_traceback
from torch.utils import _pytree as pytree

from passkit._torch.tracing import with_layout

__all__ = ["bodies_keeping_layout", "partition_region_bodies", "pin_region_operand_layouts", "remember_region_schemas"]

_SCHEMAS: "weakref.WeakKeyDictionary[Any, dict[Any, Any]]" = weakref.WeakKeyDictionary()


def _body(subgraph: Any) -> Any:
    """The graph behind a callable wrapping it (passkit's per-call wrapper, torch's ctx wrappers)."""
    seen = 0
    while not isinstance(subgraph, GraphModule) and seen < 4:
        inner = getattr(subgraph, "__wrapped__", None) or getattr(subgraph, "subgraph", None)
        if inner is None:
            return None
        subgraph, seen = inner, seen + 1
    return subgraph if isinstance(subgraph, GraphModule) else None


def _operand_key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (type(value).__name__, tuple(value.shape), tuple(value.stride()), value.dtype, value.requires_grad)
    return (type(value).__name__, repr(value) if isinstance(value, (int, float, bool, str)) else None)


def remember_region_schemas() -> None:
    """Make ``invoke_subgraph.gen_schema`` compute each distinct schema once (idempotent)."""
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    if hop is None or getattr(hop, "_passkit_remembers_schemas", False):
        return
    compute = hop.gen_schema

    def gen_schema(subgraph: Any, identifier: Any, *operands: Any) -> Any:
        body = _body(subgraph)
        if body is None or not isinstance(identifier, str):
            return compute(subgraph, identifier, *operands)
        key = (identifier, tuple(_operand_key(v) for v in pytree.tree_leaves(operands)))
        known = _SCHEMAS.setdefault(body, {})
        if key not in known:
            known[key] = compute(subgraph, identifier, *operands)
        return known[key]

    hop.gen_schema = gen_schema
    hop._passkit_remembers_schemas = True


class _LayoutKeepingBody(torch.fx.Interpreter):
    """Run a body under autograd, each value laid out as the body recorded it."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        return super().call_function(target, bodies_keeping_layout(target, args), kwargs)

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        if n.op == "call_function":
            return with_layout(value, n.meta.get("val"))
        return value


def bodies_keeping_layout(target: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` of an FX call with an ``invoke_subgraph`` body replaced by a function that runs
    it keeping each value's recorded strides (see the module); other calls' ``args`` as they are.
    """
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    if hop is None or target is not hop or not args or not isinstance(args[0], GraphModule):
        return args
    body = args[0]

    def run(*operands: Any) -> Any:
        if not fx_traceback.has_preserved_node_meta():
            return _LayoutKeepingBody(body).run(*operands)
        with fx_traceback.preserve_node_meta():  # the body's stack traces reach the joint graph
            return _LayoutKeepingBody(body).run(*operands)

    run.__wrapped__ = body  # type: ignore[attr-defined]  # the body, for remember_region_schemas
    return (run, *args[1:])


def pin_region_operand_layouts(gm: GraphModule) -> int:
    """Have Inductor pass every call of a body its operands laid out as the body was traced;
    returns how many calls it pinned.

    Inductor compiles a body once, for the strides of its first call's operands, and lays each
    later call's operands out as that call's own traced values are. Two calls of one body may
    differ there (a tangent from the loss, another from the next layer's backward), and the
    body's kernels would then read the later call's operands with the first call's strides.
    Inductor takes each call's operand layouts from ``eager_input_vals`` where a node has it,
    so every call gets the body's own placeholder values there.
    """
    from passkit._torch.hops import _attribute, graph_and_subgraphs

    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    pinned = 0
    for graph_module in graph_and_subgraphs(gm):
        for node in graph_module.graph.nodes:
            if node.op != "call_function" or node.target is not hop or not isinstance(node.args[0], Node):
                continue
            body = _attribute(graph_module, str(node.args[0].target))
            if not isinstance(body, GraphModule):
                continue
            values = [n.meta.get("val") for n in body.graph.nodes if n.op == "placeholder"]
            if len(values) != len(node.args) - 2 or any(v is None for v in values):
                continue
            node.meta["eager_input_vals"] = ((None, node.args[1], *values), {})
            pinned += 1
    return pinned


def partition_region_bodies(joint: GraphModule) -> int:
    """Split each differentiated ``invoke_subgraph`` body of ``joint`` into a forward that also
    returns what its backward needs, and a backward that reads those; returns how many distinct
    bodies were split.

    ``invoke_subgraph``'s autograd rule puts the body's whole joint graph in the backward call,
    which would recompute the forward there, random draws included. torch's own AOT path splits
    each body once per identifier with its min-cut partitioner (which never recomputes a random
    op) and rewires every call; this is that step.
    """
    import functools

    from torch._functorch._aot_autograd.graph_compile import run_joint_graph_passes_on_hops
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    backward_ids = {
        node.args[1]
        for node in joint.graph.nodes
        if node.op == "call_function" and node.target is hop and isinstance(node.args[1], str) and node.args[1].startswith("bw")
    }
    if not backward_ids:
        return 0
    partition = functools.partial(min_cut_rematerialization_partition, compiler="inductor")
    run_joint_graph_passes_on_hops(joint, None, None, default_partition_fn=partition)
    joint.recompile()
    return len(backward_ids)
