"""Own Dynamo graphs that take two views of one tensor and write to one: compiled over one base.

After a graph break Dynamo passes a tensor and its view (``v = x.t()``) as two inputs.
Functionalization gives every input its own memory, so a write into one would never reach the
other, as it does in eager. As torch's AOT Autograd does ("synthetic base"), such a graph is
compiled taking the flat storage the views share in their place, each re-made inside the graph as
its ``as_strided`` view of that base: the write lands in the base, the other view reads it, and
the write-back updates the caller's memory. The caller's call passes the base.

Only groups ``as_strided`` can re-make exactly are merged: views of one dtype, none needing grad
(their gradients would have to flow back through each view's own history), whose symbolic sizes
(a graph Dynamo compiled for any size) are sums and products of the size symbols Dynamo passes as
inputs. Any other group gets the runtime's one-line refusal (``runtime.shared_inputs``).

The graph re-makes each view where it lay at compile time, so each call checks that the views
still lie there: Dynamo guards their sizes, not where they start in their memory. A call where
they lie elsewhere (a view of a larger tensor this time) runs Dynamo's graph eagerly, after one
warning line, as eager would.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.fx import Graph, GraphModule, Interpreter, Node

from passkit import _torch
from passkit.frontends.user_warnings import warn_at_user_code

__all__ = ["MISPLACED_VIEW_WARNING", "MergedViews", "merge_written_views"]

MISPLACED_VIEW_WARNING = (
    "passkit: input {index} shares memory with another input the graph writes, laid out otherwise "
    "than when it was compiled; such calls run Dynamo's graph eagerly"
)


@dataclass
class MergedViews:
    """A graph compiled over merged bases, and how a call's inputs become its inputs."""

    gm: GraphModule
    inputs: list[Any]
    groups: list[list[int]]  # per base: the caller's input positions it stands for, first kept
    layout: dict[int, list[Any]]  # per member: size, stride, offset (ints or sympy expressions)
    spans: list[Any]  # per base: how many elements from the storage's start it covers
    symbols: dict[Any, int]  # each size symbol's position among the caller's inputs

    def _value(self, entry: Any, bindings: dict[Any, int]) -> int:
        return entry if isinstance(entry, int) else int(entry.xreplace(bindings))

    def caller_inputs(self, args: Sequence[Any], spans: Sequence[Any] | None = None) -> list[Any]:
        """The compiled graph's inputs for a call's ``args``; ``spans``, the bases' lengths,
        given at compile time (evaluated from symbolic ints, they would be specialized)."""
        if spans is None:
            bindings = self._bindings(args)
            spans = [self._value(span, bindings) for span in self.spans]
        merged = {i for group in self.groups for i in group[1:]}
        by_first = {group[0]: span for group, span in zip(self.groups, spans)}
        return [args[i].as_strided((by_first[i],), (1,), 0) if i in by_first else a
                for i, a in enumerate(args) if i not in merged]

    def _bindings(self, args: Sequence[Any]) -> dict[Any, int]:
        return {symbol: int(args[i]) for symbol, i in self.symbols.items()}

    def misplaced(self, args: Sequence[Any]) -> int | None:
        """The first input that does not lie where the compiled graph re-makes it, if any."""
        bindings = self._bindings(args)
        for group in self.groups:
            for i in group:
                if _layout(args[i]) != [self._value(e, bindings) for e in self.layout[i]]:
                    return i
        return None

    def bind(self, compiled: Callable[..., Any], eager: Callable[..., Any]) -> Callable[..., Any]:
        """The caller's call: ``compiled`` over the bases, or ``eager`` (Dynamo's graph) for
        views that lie elsewhere than at compile time."""
        warned = False

        def call(*args: Any) -> Any:
            nonlocal warned
            index = self.misplaced(args)
            if index is None:
                return compiled(*self.caller_inputs(args))
            if not warned:
                warned = True
                warn_at_user_code(MISPLACED_VIEW_WARNING.format(index=index))
            return eager(*args)

        call.__wrapped__ = compiled  # type: ignore[attr-defined]
        return call


def _layout(value: torch.Tensor) -> list[Any]:
    return [*value.shape, *value.stride(), value.storage_offset()]


def _reach(value: torch.Tensor) -> Any:
    """One past the last element ``value`` reads, from its storage's start."""
    if any(size == 0 for size in value.shape):
        return value.storage_offset()
    return value.storage_offset() + sum((size - 1) * stride for size, stride in zip(value.shape, value.stride())) + 1


def _expr(entry: Any) -> Any:
    return entry.node.expr if isinstance(entry, torch.SymInt) else int(entry)


def _span(members: list[torch.Tensor]) -> Any:
    """The elements the ``members`` cover from their storage's start (an int or a ``SymInt``,
    guarded to stay the furthest reach); ``None`` for a data-dependent size."""
    return _torch.at_least_all([_reach(m) for m in members])


def _symbol_inputs(placeholders: list[Node]) -> dict[Any, int]:
    """The positions of the placeholders that pass one size symbol each (``s0``), by symbol."""
    found: dict[Any, int] = {}
    for i, node in enumerate(placeholders):
        value = node.meta.get("example_value")
        if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
            found.setdefault(value.node.expr, i)
    return found


def _expressible(entry: Any, symbols: dict[Any, int]) -> bool:
    if not isinstance(entry, torch.SymInt):
        return True
    expr = entry.node.expr
    return expr.free_symbols <= symbols.keys() and all(
        term.is_Symbol or term.is_Integer or term.is_Add or term.is_Mul for term in expr.atoms() | {expr})


def _mergeable(value: Any, symbols: dict[Any, int]) -> bool:
    return (isinstance(value, torch.Tensor) and value.layout == torch.strided and not value.requires_grad
            and all(_expressible(v, symbols) for v in _layout(value)))


def _entry_node(graph: Graph, entry: Any, symbols: dict[Any, Node]) -> Any:
    """``entry`` (an int, or a ``SymInt`` of sums and products of symbols) computed in ``graph``."""
    if not isinstance(entry, torch.SymInt):
        return int(entry)

    def build(expr: Any) -> Any:
        if expr.is_Integer:
            return int(expr)
        if expr.is_Symbol:
            return symbols[expr]
        combine = operator.add if expr.is_Add else operator.mul
        value = build(expr.args[0])
        for term in expr.args[1:]:
            value = graph.call_function(combine, (value, build(term)))
        return value

    return build(entry.node.expr)


def _written_storages(gm: GraphModule) -> set[Any]:
    """The storages the Dynamo graph writes into (each in-place node's first argument)."""
    written = set()
    for node in gm.graph.nodes:
        if _torch.writes_in_place(node) and node.args and isinstance(node.args[0], Node):
            storage = _torch.storage_of(node.args[0].meta.get("example_value"))
            if storage is not None:
                written.add(storage)
    return written


def _groups(gm: GraphModule, fakes: Sequence[Any], symbols: dict[Any, int]) -> list[list[int]]:
    by_storage: dict[Any, list[int]] = {}
    for i, value in enumerate(fakes):
        storage = _torch.storage_of(value)
        if storage is not None:
            by_storage.setdefault(storage, []).append(i)
    shared = {s: group for s, group in by_storage.items() if len(group) > 1}
    if not shared:
        return []
    written = _written_storages(gm)
    return [
        group for storage, group in shared.items()
        if storage in written
        and all(_mergeable(fakes[i], symbols) for i in group)
        and len({fakes[i].dtype for i in group}) == 1
        and _span([fakes[i] for i in group]) is not None
    ]


class _RecordValues(Interpreter):
    """Runs the merged graph on fakes, leaving each node's value where Dynamo leaves it."""

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        n.meta["example_value"] = value
        return value


def merge_written_views(gm: GraphModule, inputs: Sequence[Any]) -> MergedViews | None:
    """``gm`` over merged bases where two inputs share memory and the graph writes to it; ``None``
    where no group of inputs needs it (the usual case, decided without copying the graph)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("example_value") for n in placeholders]  # Dynamo's: symbolic where sizes are
    if len(fakes) != len(inputs) or any(f is None for f in fakes):
        return None
    symbols = _symbol_inputs(placeholders)
    groups = _groups(gm, fakes, symbols)
    if not groups:
        return None
    graph = Graph()
    val_map: dict[Node, Node] = {}
    bases: dict[int, Node] = {}
    for i, node in enumerate(placeholders):
        group = next((g for g in groups if i in g), None)
        if group is None:
            val_map[node] = graph.placeholder(node.name)
        elif i == group[0]:
            bases[i] = graph.placeholder(f"{node.name}_base")
    symbol_nodes = {symbol: val_map[placeholders[i]] for symbol, i in symbols.items()}
    for group in groups:
        for i in group:
            rank = fakes[i].dim()
            geometry = [_entry_node(graph, entry, symbol_nodes) for entry in _layout(fakes[i])]
            val_map[placeholders[i]] = graph.call_function(
                torch.as_strided, (bases[group[0]], geometry[:rank], geometry[rank:-1], geometry[-1]))
    graph.output(graph.graph_copy(gm.graph, val_map))
    merged_gm = GraphModule(gm, graph)
    merged_gm.meta.update(gm.meta)
    layout = {i: [_expr(e) for e in _layout(fakes[i])] for group in groups for i in group}
    fake_spans = [_span([fakes[i] for i in group]) for group in groups]
    merged = MergedViews(merged_gm, [], groups, layout, [_expr(span) for span in fake_spans], symbols)
    with _torch.in_fake_mode(_torch.fake_mode_of(fakes)):
        _RecordValues(merged_gm).run(*merged.caller_inputs(fakes, fake_spans))
    # Dynamo's example inputs: real tensors beside symbolic ints, so each span is the real one.
    merged.inputs = merged.caller_inputs(inputs, [_span([inputs[i] for i in group]) for group in groups])
    return merged
