"""Own replacement: put a match's replacement into the graph, or refuse it.

A replacement is either a torch function traced on the bound values' fake tensors (``replace=``)
and inlined, or a graph builder (``build=``) that adds nodes one by one with
``builder.call(op, *args, **kwargs)``; each node gets its ``meta["val"]`` by running the op on
fake tensors. The new nodes go right after the last bound input, which must come before every
outside user of the matched outputs. A replacement whose outputs differ in shape or dtype from
what they replace is refused, and nothing is changed.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.patterns.matcher import Match

__all__ = ["GraphBuilder", "apply_replacement", "refusal"]


class GraphBuilder:
    """Adds nodes for a ``build=`` replacement, each with a fake ``meta["val"]``."""

    def __init__(self, gm: GraphModule, meta: dict[str, Any]) -> None:
        self.gm = gm
        self.graph = gm.graph
        self.meta = meta
        self.created: list[Node] = []

    def call(self, target: Any, *args: Any, **kwargs: Any) -> Node:
        """A ``call_function`` node of ``target``; its value is computed on fake tensors."""
        node = self.graph.call_function(target, tuple(args), dict(kwargs))
        self.created.append(node)
        node.meta.update(self.meta)
        vals_args, vals_kwargs = _torch.pytree.tree_map(_val, (tuple(args), dict(kwargs)))
        # A factory (``ones``, ``full``) reads no tensor: its value is made in the graph's fake
        # mode all the same, so later ops never mix real and fake tensors.
        mode = _torch.fake_mode_of(_torch.pytree.tree_leaves((vals_args, vals_kwargs))) or self._graph_fake_mode()
        with mode if mode is not None else torch.no_grad():
            node.meta["val"] = target(*vals_args, **vals_kwargs)
        return node

    def val(self, node: Any) -> Any:
        """The fake value of a node (or the literal itself)."""
        return _val(node)

    def _graph_fake_mode(self) -> Any:
        # Placeholders lead an FX graph: read them, not the whole graph, once per factory made.
        inputs = itertools.takewhile(lambda n: n.op == "placeholder", self.graph.nodes)
        return _torch.fake_mode_of([n.meta.get("val") for n in inputs])


def _val(value: Any) -> Any:
    return value.meta.get("val") if isinstance(value, Node) else value


def refusal(match: Match, order: dict[Node, int]) -> str | None:
    """Why the match must not be rewritten, or None.

    ``intermediate used outside``: a matched value other than an output feeds a node outside the
    match, so it would have to stay (and the rewrite would compute it twice).
    ``crosses a mutation``: a mutating op runs among the matched nodes on one of their values.
    """
    inside = set(match.nodes)
    roots = set(match.roots)
    for node in match.nodes:
        if node in roots:
            continue
        if any(user not in inside for user in node.users):
            return "intermediate used outside"
    touched = inside | {v for v in match.bindings.values() if isinstance(v, Node)}
    positions = [order[n] for n in touched if n in order and n.op != "placeholder"]
    first, last = (min(positions), max(positions)) if positions else (0, -1)
    for node in inside:
        if _mutates(node):
            return "crosses a mutation"
    for node in list(order):
        if first <= order[node] <= last and _mutates(node) and any(a in touched for a in node.all_input_nodes):
            return "crosses a mutation"
    return None


def _mutates(node: Node) -> bool:
    target = node.target
    return node.op == "call_function" and isinstance(target, _torch.OpOverload) and target._schema.is_mutable


def _insertion_point(match: Match, order: dict[Node, int]) -> Node | None:
    """The node before which the replacement goes, or None when no place is valid."""
    inside = set(match.nodes)
    bound = [v for v in match.bindings.values() if isinstance(v, Node)]
    outside_users = [u for r in match.roots for u in r.users if u not in inside]
    earliest_use = min((order[u] for u in outside_users), default=len(order))
    if not bound:
        return min(match.nodes, key=order.__getitem__)
    anchor = max(bound, key=order.__getitem__)
    return anchor.next if order[anchor] < earliest_use else None


def apply_replacement(gm: GraphModule, match: Match) -> bool | str:
    """Replace ``match`` in ``gm``; False (graph untouched) if it cannot be placed or checked.

    Returns ``"relayout"`` instead of True when an output has other strides than what it
    replaces: later nodes' metadata is then stale, and the caller must re-derive it.
    """
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    before = _insertion_point(match, order)
    if before is None:
        return False
    meta = {k: match.roots[0].meta[k] for k in ("stack_trace", "nn_module_stack") if k in match.roots[0].meta}
    with gm.graph.inserting_before(before):
        builder = GraphBuilder(gm, meta)
        if match.pattern.build is not None:
            outs = match.pattern.build(builder, **match.bindings)
        else:
            outs = _inline_traced(builder, match)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    if len(outs) != len(match.roots) or not all(_same_meta(o, r) for o, r in zip(outs, match.roots)):
        for node in reversed(builder.created):
            if not node.users:
                gm.graph.erase_node(node)
        return False
    relayout = any(not _same_strides(o, r) for o, r in zip(outs, match.roots))
    for out, root in zip(outs, match.roots):
        root.replace_all_uses_with(out)
    inside = set(match.nodes)
    for node in reversed(list(gm.graph.nodes)):
        if node in inside and not node.users:
            gm.graph.erase_node(node)
    return "relayout" if relayout else True


def _same_strides(new: Any, old: Node) -> bool:
    a, b = _val(new), old.meta.get("val")
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.stride() == b.stride()
    return True


def _same_meta(new: Any, old: Node) -> bool:
    a, b = _val(new), old.meta.get("val")
    if isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype
    return True


def _inline_traced(builder: GraphBuilder, match: Match) -> Any:
    names = [k for k, v in match.bindings.items() if isinstance(v, Node)]
    literals = {k: v for k, v in match.bindings.items() if not isinstance(v, Node)}

    def replacement(*tensors: Any) -> Any:
        return match.pattern.replace(**dict(zip(names, tensors)), **literals)

    fake_args = [match.bindings[k].meta["val"] for k in names]
    traced = _torch.trace_graph(replacement, fake_args, pre_dispatch=False)
    env: dict[Node, Any] = {}
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for placeholder, key in zip(placeholders, names):
        env[placeholder] = match.bindings[key]
    result: Any = None
    for node in traced.graph.nodes:
        if node.op == "call_function":
            new = builder.graph.node_copy(node, lambda n: env[n])
            new.meta.update(builder.meta)
            builder.created.append(new)
            env[node] = new
        elif node.op == "output":
            result = _torch.pytree.tree_map(lambda v: env.get(v, v) if isinstance(v, Node) else v, node.args[0])
        elif node.op == "get_attr":
            raise ValueError(f"pattern {match.pattern.name!r}: the replacement uses a tensor constant; build it in the function")
    return result
