"""Own what outlined regions (``invoke_subgraph`` bodies called many times) need from torch: one
schema per body, and each differentiated body split into forward and backward once.

torch derives ``invoke_subgraph``'s schema (which operands it mutates or aliases) by tracing its
body again, on every call: its autograd key does so before each differentiated call, and its
functionalization rule keys its own cache on the identity of the callable, which passkit wraps
afresh for each call. With one body called 24 times that is 24 traces of the body in
``functionalize`` and 24 more in ``joint``. The schema depends only on the body and on the
operands' types, shapes, strides, dtypes and ``requires_grad``, so ``region_schemas_remembered``
keeps one per (body, identifier, operands' metadata), the body held weakly. It does so only
around passkit's own traces: torch stays as it is for everything else in the process.

``joint`` lowers ops with their own autograd formula as it differentiates, and a decomposition
may lay a value out otherwise than the op the body recorded (Inductor's ``cat`` of an empty
past and one tensor returns that tensor's transposed strides), while the body's ``view`` nodes
rely on the recorded layout. ``_torch.bodies_keeping_layout`` (with the layout helpers in
``tracing``) hands torch each body as a function that keeps every value's recorded strides, as
``joint`` already does for the graph around it.

One body may serve calls whose operands differ in ``requires_grad`` only (the first layer of a
stack reads the model's input, the others read activations). torch caches a body's backward by
its identifier and the tangents' metadata, not by which operands needed grad, so whichever call
was differentiated first would decide for all: a later call could get no gradient for an operand
that needs one. ``region_operands_needing_grad`` notes, per body, the operands any call
differentiates, and ``region_operands_differentiated`` makes each call differentiate those: the
first layer computes a gradient for its input that nothing reads.
"""

from __future__ import annotations

import contextlib
import inspect
import types
import weakref
from typing import Any, Callable, Iterator

import torch
from torch.fx import GraphModule
from torch.utils import _pytree as pytree

__all__ = ["partition_region_bodies", "region_schemas_remembered", "region_operands_needing_grad", "region_operands_differentiated"]

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
        return (type(value).__name__, _sizes_key(value.shape), _sizes_key(value.stride()), value.dtype, value.requires_grad)
    if isinstance(value, torch.SymInt):
        return ("SymInt", str(value))
    return (type(value).__name__, repr(value) if isinstance(value, (int, float, bool, str)) else None)


def _sizes_key(sizes: Any) -> tuple[Any, ...]:
    """Sizes or strides as a key: a symbolic one by its expression (a SymInt has no hash)."""
    return tuple(str(size) if isinstance(size, torch.SymInt) else size for size in sizes)


@contextlib.contextmanager
def region_schemas_remembered() -> Iterator[None]:
    """While inside, ``invoke_subgraph.gen_schema`` computes each distinct schema once (see the
    module); torch's own method is back on exit. Re-entrant: an inner use changes nothing."""
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    if hop is None or getattr(hop, "_passkit_remembers_schemas", False):
        yield
        return
    own = "gen_schema" in vars(hop)
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
    try:
        yield
    finally:
        del hop._passkit_remembers_schemas
        if own:
            hop.gen_schema = compute
        else:
            del hop.gen_schema


def partition_region_bodies(joint: GraphModule, partition: Callable[..., Any] | None = None) -> int:
    """Split each differentiated ``invoke_subgraph`` body of ``joint`` into a forward that also
    returns what its backward needs, and a backward that reads those; returns how many distinct
    bodies were split.

    ``invoke_subgraph``'s autograd rule puts the body's whole joint graph in the backward call,
    which would recompute the forward there, random draws included. torch's own AOT path splits
    each body once per identifier with its min-cut partitioner (which never recomputes a random
    op) and rewires every call; this is that step. ``partition`` replaces torch's min-cut: it
    takes a body's joint and returns its forward and backward, as torch's partitioners do.
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
    if partition is None:
        partition = functools.partial(min_cut_rematerialization_partition, compiler="inductor")
    if "default_partition_fn" in inspect.signature(run_joint_graph_passes_on_hops).parameters:
        run_joint_graph_passes_on_hops(joint, None, None, default_partition_fn=partition)
    else:  # torch 2.11 reads the partitioner from the AOT config, and nothing else of it
        run_joint_graph_passes_on_hops(joint, None, types.SimpleNamespace(partition_fn=partition))
    joint.recompile()
    return len(backward_ids)


def region_operands_needing_grad(target: Any, args: tuple[Any, ...], needed: dict[str, list[bool]]) -> None:
    """Note in ``needed`` which operands of this ``invoke_subgraph`` call require grad (OR-ed
    with the body's other calls, by identifier)."""
    if target is not getattr(torch.ops.higher_order, "invoke_subgraph", None) or not isinstance(args[1], str):
        return
    flags = [isinstance(value, torch.Tensor) and value.requires_grad for value in args[2:]]
    known = needed.setdefault(args[1], flags)
    needed[args[1]] = [a or b for a, b in zip(known, flags)]


def region_operands_differentiated(target: Any, args: tuple[Any, ...], needed: dict[str, list[bool]]) -> tuple[Any, ...]:
    """``args`` of an ``invoke_subgraph`` call with each operand another call of the same body
    differentiates made an autograd leaf of its own (see the module)."""
    if target is not getattr(torch.ops.higher_order, "invoke_subgraph", None) or args[1] not in needed:
        return args
    operands = [
        value.detach().requires_grad_(True)
        if wanted and isinstance(value, torch.Tensor) and not value.requires_grad
        and (value.is_floating_point() or value.is_complex()) else value
        for value, wanted in zip(args[2:], needed[args[1]])
    ]
    return (*args[:2], *operands)
