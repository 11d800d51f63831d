"""Own the min-cut behind ``partition.min_cut``: which forward values to save, as a flow problem.

Every forward value ``X`` that the backward may need becomes two flow nodes, ``X_in -> X_out``,
and the cut decides each value's fate:

- ``X_in`` on the source side and ``X_out`` on the sink side: ``X`` is computed in the forward
  and **saved**; that edge costs ``X``'s bytes;
- both on the sink side: ``X`` is **recomputed** in the backward; the edge ``source -> X_in``
  costs ``X``'s recompute time when the forward computes ``X`` anyway (a value that only the
  backward needs costs nothing extra to compute there);
- data edges ``X_out -> Y_in`` and the edges into the sink from values the backward reads are
  unbounded, so the backward always has what it needs.

Rules become unbounded edges: ``source -> X_in`` keeps ``X`` out of the backward (inputs, random
ops, ``never_recompute``, ``save``), ``X_in -> sink`` forces its recomputation (checkpoint tags,
``recompute``), ``X_out -> sink`` forces its saving (``save``). Costs are whole numbers
(nanoseconds and bytes) weighted ``a * time + b * bytes``; ``networkx.minimum_cut`` solves each
weighting exactly. The plans on the lower convex hull of (bytes, time) are found by searching
weightings between two known plans, the classic parametric search, so a memory limit costs a
few cuts rather than a sweep. A limit between two frontier plans is then met by greedy steps from
both sides (see ``Problem.fastest_within``), since the best plan under it need not lie on the hull.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Iterable

import networkx as nx
from networkx.algorithms.flow import boykov_kolmogorov
from torch.fx import Node

from passkit.passes.partition_costs import node_bytes, storage_root

__all__ = ["Problem", "Plan", "PlanError"]

_MAX_HULL_CUTS = 40
_FILL_STARTS = 3  # frontier plans under the limit that the gap fill starts from
_COSTLY_CANDIDATES = 64  # of a plan's recomputed values, the slowest few that the fill may save


class PlanError(Exception):
    """The rules contradict each other (a value must be both recomputed and kept)."""


@dataclass(frozen=True)
class Plan:
    """One partition: the values saved, the ones recomputed, and what that costs."""

    saved: tuple[Node, ...]
    recomputed: frozenset[Node]
    bytes: int
    time_ns: int


@dataclass
class Problem:
    """The flow network for one joint graph, with costs and rules attached to its nodes."""

    forward: set[Node]
    """Values computable without tangents (placeholders included)."""
    required: set[Node]
    """Values the forward outputs need: the forward computes these whatever the plan."""
    read_by_backward: set[Node]
    """Forward values that backward nodes or gradient outputs read directly."""
    time_ns: dict[Node, int]
    keep: set[Node] = field(default_factory=set)
    """Never recomputed (inputs, random ops, ``never_recompute``, ``save``)."""
    must_recompute: set[Node] = field(default_factory=set)
    must_save: set[Node] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.relevant = _ancestors_within(self.read_by_backward, self.forward)
        # A multi-output op is saved through its items, so the rule applies to them.
        self.must_save = {n for n in self.must_save & self.relevant if not _is_multi_output(n)}
        self.must_recompute &= self.relevant
        self.bytes = {n: node_bytes(n) for n in self.relevant}
        # Plans are evaluated thousands of times on a large model: walk plain dicts, not FX nodes.
        self._inputs = {n: [a for a in n.all_input_nodes if a in self.relevant] for n in self.relevant}
        self._root_bytes = {n: (storage_root(n), self.bytes[n]) for n in self.relevant}
        self._reads = [n for n in self.read_by_backward if n in self.relevant]
        self._plans: dict[tuple[Node, ...], Plan] = {}

    # -- one cut ---------------------------------------------------------------------------

    def _network(self, time_weight: int, byte_weight: int) -> nx.DiGraph:
        graph = nx.DiGraph()
        for node in self.relevant:
            inner, outer = ("in", node), ("out", node)
            if _is_multi_output(node):
                graph.add_edge(inner, outer)  # a tuple is never saved whole; its items are
            else:
                graph.add_edge(inner, outer, capacity=byte_weight * self.bytes[node])
            if node in self.keep or node.op == "placeholder":
                graph.add_edge("source", inner)
            elif node in self.required:
                graph.add_edge("source", inner, capacity=time_weight * self.time_ns.get(node, 0))
            if node in self.must_recompute:
                graph.add_edge(inner, "sink")
            if node in self.read_by_backward or node in self.must_save:
                graph.add_edge(outer, "sink")
            for user in node.users:
                if user in self.relevant:
                    graph.add_edge(outer, ("in", user))
        return graph

    def cut(self, time_weight: int, byte_weight: int) -> Plan:
        """The plan that minimises ``time_weight * time + byte_weight * bytes``."""
        graph = self._network(time_weight, byte_weight)
        if "source" not in graph or "sink" not in graph:
            return self.evaluate([])  # the backward reads nothing of the forward (or nothing at all)
        try:
            _, (source_side, _) = nx.minimum_cut(graph, "source", "sink", flow_func=boykov_kolmogorov)
        except nx.NetworkXUnbounded:
            raise PlanError(_contradiction(self)) from None
        saved = [n for n in self.relevant if ("in", n) in source_side and ("out", n) not in source_side]
        return self.evaluate(saved)

    def evaluate(self, saved: Iterable[Node]) -> Plan:
        """Bytes (each storage once) and recompute time of the plan that saves ``saved``.

        Inputs and kept values (random ops, ``never_recompute``) that the backward would reach
        are saved too, so every plan this returns is one the rules allow.
        """
        order = self._position()
        saved_tuple = tuple(sorted({n for n in _items_of(saved) if n in order}, key=order.__getitem__))
        if saved_tuple in self._plans:
            return self._plans[saved_tuple]
        saved_set = set(saved_tuple)
        in_backward = self._reached(saved_set)
        forced = [n for n in in_backward - saved_set
                  if n.op == "placeholder" or (n in self.keep and n in self.required)]
        if forced:
            return self.evaluate((*saved_tuple, *forced))
        # A value nothing in the backward reads any more (its readers are saved) is not saved.
        needed = tuple(n for n in saved_tuple if n in in_backward or n in self.must_save)
        if needed != saved_tuple:
            return self.evaluate(needed)
        # A value only the backward needs is computed there in any plan; recomputing means the
        # forward computes it too.
        recomputed = frozenset(n for n in in_backward - saved_set if n in self.required and n.op != "placeholder")
        total = sum(dict(self._root_bytes[n] for n in saved_tuple).values())
        time_ns = sum(self.time_ns.get(n, 0) for n in recomputed)
        plan = Plan(saved_tuple, recomputed, total, time_ns)
        self._plans[saved_tuple] = plan
        return plan

    def _reached(self, saved: set[Node]) -> set[Node]:
        """Forward values the backward reaches: those it reads, and what computes them, back to
        the saved values."""
        seen: set[Node] = set()
        stack = list(self._reads)
        inputs = self._inputs
        while stack:
            node = stack.pop()
            if node not in seen:
                seen.add(node)
                if node not in saved:
                    stack.extend(inputs[node])
        return seen

    def _position(self) -> dict[Node, int]:
        """Each relevant value's place in graph order, which orders a plan's saved values."""
        if not hasattr(self, "_positions"):
            graph = next(iter(self.relevant)).graph if self.relevant else None
            nodes = [n for n in graph.nodes if n in self.relevant] if graph is not None else []
            self._positions = {n: i for i, n in enumerate(nodes)}
        return self._positions

    # -- the time/bytes frontier ------------------------------------------------------------

    def fastest(self) -> Plan:
        """Least recompute time; fewest bytes among those."""
        return self.cut(time_weight=sum(self.bytes.values()) + 1, byte_weight=1)

    def smallest(self) -> Plan:
        """Fewest bytes; least recompute time among those."""
        return self.cut(time_weight=1, byte_weight=sum(self.time_ns.values()) + 1)

    def fastest_within(self, limit: int, *, slack_ns: int = 0) -> Plan | None:
        """The fastest plan found whose bytes are at most ``limit``; or, among plans at most
        ``slack_ns`` slower than that one, the one that saves the fewest bytes.

        The convex frontier comes first (exact cuts); then the gap around the limit is filled
        greedily from both sides. From each of the nearest frontier plans under the limit, values
        that the plan above it saves, or that this one recomputes at a cost, are saved too, best
        time saved per byte first, while the limit holds; from the plan above, values it saves
        are recomputed instead, least time lost per byte freed first, until the limit holds.
        """
        hull = self._hull_around(limit)
        if hull is None:
            return None
        below = sorted((p for p in hull if p.bytes <= limit), key=lambda p: p.bytes)[-_FILL_STARTS:]
        above = [p for p in hull if p.bytes > limit]
        found = set(hull)
        if above:
            high = min(above, key=lambda p: p.bytes)
            for low in below:
                found.update(self._fill(low, high, limit))
            found.update(self._shrink(high, limit))
        within = [p for p in found if p.bytes <= limit]
        fastest = min(within, key=lambda p: (p.time_ns, p.bytes))
        if slack_ns:  # the same plan with one value recomputed may cost next to nothing
            within += [p for _, p in self._single_drops(fastest)]
        return min((p for p in within if p.time_ns <= fastest.time_ns + slack_ns), key=lambda p: (p.bytes, p.time_ns))

    def _fill(self, low: Plan, high: Plan, limit: int) -> list[Plan]:
        """Plans between ``low`` and ``high``: ``low`` saving more values that cost it time."""
        # One pass in order of time saved per byte, each measured against ``low``: a knapsack's
        # greedy order, two plan evaluations per candidate however large the graph.
        scored, in_low, in_high = [], set(low.saved), set(high.saved)
        costly = sorted((n for n in low.recomputed if self.time_ns.get(n, 0) > 0 and n not in in_high),
                        key=lambda n: -self.time_ns[n])[:_COSTLY_CANDIDATES]
        for node in (n for n in (*high.saved, *costly) if n not in in_low and n not in self.must_recompute):
            alone = self.evaluate((*low.saved, node))
            gained = low.time_ns - alone.time_ns
            if gained > 0 and alone.bytes <= limit:
                scored.append((gained / max(alone.bytes - low.bytes, 1), node))
        path, current = [], low
        for _, node in sorted(scored, key=lambda item: -item[0]):
            plan = self.evaluate((*current.saved, node))
            if plan.bytes <= limit and plan.time_ns < current.time_ns:
                path.append(plan)
                current = plan
        return path

    def _shrink(self, high: Plan, limit: int) -> list[Plan]:
        """Plans below ``high``: values it saves recomputed instead, until the limit holds.

        Two greedy orders, one pass each (as ``_fill``): least time lost per byte freed, which
        suits a limit far below ``high``; and least time lost, which suits one just below it,
        where the best value per byte (a whole activation) frees far more than the excess and
        several small values (a normalisation's statistics) cost far less time to recompute.
        """
        drops = self._single_drops(high)
        path = [plan for _, plan in drops if plan.bytes <= limit]  # a small excess: one value is enough
        per_byte = sorted(drops, key=lambda d: (d[1].time_ns - high.time_ns) / (high.bytes - d[1].bytes))
        per_time = sorted(drops, key=lambda d: d[1].time_ns - high.time_ns)
        for order in (per_byte, per_time):
            current = high
            for node, _ in order:
                if current.bytes <= limit:
                    break
                plan = self.evaluate(n for n in current.saved if n is not node)
                if plan.bytes < current.bytes:
                    path.append(plan)
                    current = plan
        return path

    def _single_drops(self, plan: Plan) -> list[tuple[Node, Plan]]:
        """Each value ``plan`` saves that may be recomputed, with the plan that recomputes it."""
        drops = []
        for node in plan.saved:
            if node.op == "placeholder" or node in self.keep or node in self.must_save:
                continue
            smaller = self.evaluate(n for n in plan.saved if n is not node)
            if smaller.bytes < plan.bytes:
                drops.append((node, smaller))
        return drops

    def _hull_around(self, limit: int) -> list[Plan] | None:
        """Frontier plans, refined until the two on either side of ``limit`` are neighbours."""
        hull = sorted({self.smallest(), self.fastest()}, key=lambda p: (p.bytes, p.time_ns))
        if hull[0].bytes > limit:
            return None
        for _ in range(_MAX_HULL_CUTS):
            within = [p for p in hull if p.bytes <= limit]
            above = [p for p in hull if p.bytes > limit]
            if not above:
                break
            low, high = within[-1], above[0]
            if high.time_ns >= low.time_ns:
                break
            middle = self.cut(time_weight=high.bytes - low.bytes, byte_weight=low.time_ns - high.time_ns)
            if middle in hull:
                break
            hull = sorted(set(hull) | {middle}, key=lambda p: (p.bytes, p.time_ns))
        return hull


def _is_multi_output(node: Node) -> bool:
    return isinstance(node.meta.get("val"), (tuple, list))


def _items_of(saved: Iterable[Node]) -> list[Node]:
    """Save a multi-output op's items, never its tuple."""
    result = []
    for node in saved:
        if _is_multi_output(node):
            result.extend(u for u in node.users if u.target is operator.getitem)
        else:
            result.append(node)
    return result


def _ancestors_within(roots: Iterable[Node], within: set[Node]) -> set[Node]:
    seen: set[Node] = set()
    stack = [r for r in roots if r in within]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(n for n in node.all_input_nodes if n in within)
    return seen


def _contradiction(problem: Problem) -> str:
    # Only a value computed straight from a kept multi-output op can be both forced into the
    # backward and barred from it: the op's items are never recomputed.
    clash = [n for n in problem.must_recompute if any(a in problem.keep and _is_multi_output(a) for a in n.all_input_nodes)]
    names = ", ".join(sorted(n.name for n in clash)[:3]) or "a recomputed value"
    return f"recompute rules contradict keep rules (random ops, never_recompute, save) at {names}"
