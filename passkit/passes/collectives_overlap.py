"""Own ``collectives.overlap``: each collective started as early as its inputs allow and waited
for as late as its first use, so that compute runs while the bytes travel.

A post-partition pass, after ``collectives.bucket``. Only collectives and their waits move;
every other node keeps its place relative to the others, so what the graph computes, and in
which order its compute and side effects run, is unchanged. The collectives keep their order
among themselves too, so every rank (each compiles the same graph) issues the same collectives
in the same order, as gloo and NCCL need.

The cost model is bytes, not time: torch's ``schedule_overlap_bucketing`` estimates time from the
GPU's bandwidth (it asks Triton, and fails on the CPU), and on a CPU whose cores gloo shares
with compute no estimate holds. Starting a collective early keeps its output buffer alive
longer, so at most ``max_in_flight_mb`` MiB of collectives (sent or received, whichever is
larger) are in flight at once; a collective that would pass it starts when an earlier one has
been waited for. One always may start, however large. A node that mutates memory is a fence: no
collective starts before an earlier one of those, and every wait in flight comes before it.

A wait is *exposed* when no compute node (anything but views, ``getitem`` and other
collectives and waits) lies between its collective and itself: the step waits for the whole
transfer. The report row gives ``exposed_waits`` before and after, and ``hideable`` after: the
exposed waits that had compute in the graph's own order between their collective's last input
and the first use of their result (the ones the byte limit kept exposed). A graph without
collectives is untouched (the pass returns False).
"""

from __future__ import annotations

import heapq
from collections import deque

from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program
from passkit.passes.collectives_bucket import collective_graphs
from passkit.passes.partition_costs import is_free, reads_no_tensor

__all__ = ["overlap", "exposed_waits", "is_compute"]

_MB = 1024 * 1024


def is_compute(node: Node) -> bool:
    """Work a transfer can hide behind: a call that is no view, collective or wait."""
    return not (is_free(node) or _torch.collective_kind(node) or _torch.is_wait(node))


def _pairs(gm: GraphModule) -> dict[Node, Node]:
    """Each collective waited for by exactly one wait (its only user): collective -> wait."""
    pairs = {}
    for node in gm.graph.nodes:
        if _torch.collective_kind(node) and len(node.users) == 1:
            (user,) = node.users
            if _torch.is_wait(user):
                pairs[node] = user
    return pairs


def exposed_waits(gm: GraphModule) -> list[Node]:
    """The waits with no compute node between their collective and themselves."""
    exposed, open_collectives = [], {}
    pairs = _pairs(gm)
    waits = {w: c for c, w in pairs.items()}
    for node in gm.graph.nodes:
        if node in pairs:
            open_collectives[node] = False
        elif node in waits:
            if not open_collectives.pop(waits[node], True):
                exposed.append(node)
        elif is_compute(node):
            for c in open_collectives:
                open_collectives[c] = True
    return exposed


def _hideable(gm: GraphModule, exposed: list[Node]) -> int:
    """Exposed waits with compute, in the graph's order, between their collective's last input
    and the first user of their result."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    compute_at = [i for n, i in order.items() if is_compute(n)]
    count = 0
    for wait in exposed:
        collective = wait.args[0]
        start = max((order[i] for i in collective.all_input_nodes), default=-1)
        end = min((order[u] for u in wait.users), default=len(order))
        count += any(start < i < end for i in compute_at)
    return count


class _Unschedulable(Exception):
    """A collective's input is not placed when it must start: leave the graph as it is."""


def _writes_into_own_buffer(node: Node, collective: Node) -> bool:
    """``copy_`` into a view of a fresh buffer that only it and the collective touch."""
    target, chain = node.args[0] if node.args else None, [node]
    while isinstance(target, Node) and is_free(target) and target.op == "call_function":
        chain.append(target)
        target = target.all_input_nodes[0] if len(target.all_input_nodes) == 1 else None
    if not isinstance(target, Node) or not reads_no_tensor(target):
        return False
    chain.append(target)
    return all(u is collective or u in chain for n in chain[1:] for u in n.users)


def _prologue(collective: Node, index: dict[Node, int], pairs: dict[Node, Node]) -> list[Node]:
    """What only this collective reads, built from nothing but its own inputs: a bucket's
    copy-in (``empty``, views, ``cat``, ``copy_`` into that buffer). It moves with the collective."""
    members: set[Node] = set()
    heap = [(-index[n], n.name, n) for n in collective.all_input_nodes]
    heapq.heapify(heap)
    while heap:  # latest first, so a node's users are decided before it
        _, _, node = heapq.heappop(heap)
        if node in members or node.op != "call_function" or node in pairs or _torch.is_wait(node):
            continue
        if _torch.call_draws_random_numbers(node) or (_torch.is_impure(node) and not _torch.mutates(node)):
            continue
        if _torch.mutates(node) and not _writes_into_own_buffer(node, collective):
            continue  # writes into memory others see
        if all(u is collective or u in members for u in node.users):
            members.add(node)
            for arg in node.all_input_nodes:
                heapq.heappush(heap, (-index[arg], arg.name, arg))
    return sorted(members, key=index.__getitem__)


def _epilogue(wait: Node, index: dict[Node, int]) -> list[Node]:
    """Views of the wait's value (a bucket's ``split`` and ``getitem``): placed with the wait, so
    that they do not pull it ahead of its first real use."""
    members: list[Node] = []
    stack = list(wait.users)
    while stack:
        node = stack.pop()
        if node in members or node.op != "call_function" or not is_free(node):
            continue
        if all(a is wait or a in members for a in node.all_input_nodes):
            members.append(node)
            stack.extend(node.users)
    return sorted(members, key=index.__getitem__)


def _schedule(gm: GraphModule, limit: int) -> bool:
    pairs = _pairs(gm)
    if not pairs:
        return False
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    waits = {w: c for c, w in pairs.items()}
    prologue = {c: _prologue(c, index, pairs) for c in pairs}
    epilogue = {w: _epilogue(w, index) for w in waits}
    owner = {n: w for w, members in epilogue.items() for n in members}
    owner.update({w: w for w in waits})
    moving = set(pairs) | set(owner) | {n for members in prologue.values() for n in members}
    # A collective may not start before the last memory-mutating node that preceded it.
    fence_before: dict[Node, Node | None] = {}
    fence = None
    for node in nodes:
        if node in pairs:
            fence_before[node] = fence
        elif node not in moving and _torch.mutates(node):
            fence = node
    pending = deque(c for c in nodes if c in pairs)
    others = [n for n in nodes if n not in moving]
    placed: set[Node] = set()
    order: list[Node] = []
    in_flight: dict[Node, int] = {}

    def place(node: Node) -> None:
        order.append(node)
        placed.add(node)

    def outside(collective: Node) -> list[Node]:
        inside = set(prologue[collective])
        return [a for n in (*prologue[collective], collective) for a in n.all_input_nodes if a not in inside]

    def start_next() -> None:
        collective = pending.popleft()
        for arg in outside(collective):
            if arg in owner and arg not in placed:
                finish(owner[arg])
            elif arg not in placed:
                raise _Unschedulable(arg.name)
        for node in (*prologue[collective], collective):
            place(node)
        in_flight[collective] = _torch.collective_bytes(collective)

    def finish(wait: Node) -> None:
        if wait in placed:
            return
        while waits[wait] not in placed:
            start_next()
        place(wait)
        in_flight.pop(waits[wait], None)
        for node in epilogue[wait]:
            place(node)

    def start_ready() -> None:
        while pending:
            collective = pending[0]
            fence = fence_before[collective]
            ready = all(a in placed for a in outside(collective)) and (fence is None or fence in placed)
            size = _torch.collective_bytes(collective)
            if not ready or (in_flight and sum(in_flight.values()) + size > limit):
                return
            start_next()

    try:
        for position, node in enumerate(others):
            if node.op == "output" or _torch.mutates(node):
                while pending and node.op == "output":
                    start_next()
                for collective in list(in_flight):
                    finish(pairs[collective])
            for arg in node.all_input_nodes:
                if arg in owner:
                    finish(owner[arg])
            place(node)
            # Placeholders stay together at the top of the graph.
            if position + 1 < len(others) and others[position + 1].op != "placeholder":
                start_ready()
    except _Unschedulable:
        return False
    if order == nodes or len(order) != len(nodes):
        return False
    _reorder(gm, order)
    return True


def _reorder(gm: GraphModule, order: list[Node]) -> None:
    # Re-link every node in the new order, from the end: prepend each before the one after it.
    anchor = order[-1]
    for node in reversed(order[:-1]):
        if node.op == "placeholder":
            continue
        if node.next is not anchor:
            anchor.prepend(node)
        anchor = node
    gm.graph.lint()
    gm.recompile()


@graph_pass("collectives.overlap")
def overlap(program: Program, *, max_in_flight_mb: float = 32.0) -> bool:
    """Start each collective as early as its inputs allow and wait as late as its first use."""
    graphs = collective_graphs(program)
    if not graphs:
        return False
    limit = int(max_in_flight_mb * _MB)
    changed = False
    before = after = hideable = 0
    for _name, gm in graphs:
        before += len(exposed_waits(gm))
        changed |= _schedule(gm, limit)
        left = exposed_waits(gm)
        after += len(left)
        hideable += _hideable(gm, left)
    program.record_stat("exposed_waits", f"{before}->{after}")
    program.record_stat("hideable", hideable)
    return changed


@hookimpl
def passkit_register_passes() -> list:
    return [overlap]
