"""Own ``collectives.reshard``: whether parameters gathered in the forward are saved for the
backward, or gathered again there (FSDP's reshard after forward).

A joint-graph pass, before the partitioner. SimpleFSDP-style programs gather each sharded
parameter in the forward (``all_gather_into_tensor`` and its wait, then views); the backward's
matmuls read the gathered value too, so every partitioner saves it: the whole parameter stays
alive between forward and backward on every rank, as in eager. With ``after_forward = true``
each gather the backward reads is repeated for the backward (a second ``all_gather`` and wait
from the same shard, and the same views), so the partitioner saves the shard, not the gathered
tensor: saved bytes fall by (world - 1) / world of those parameters, for one more gather each
in the backward. The new gathers issue in the same order on every rank.

With ``after_forward = false`` the graph is left as it is (the gathered value is saved). The
report row gives the gathers the backward reads (``gathers``) and their gathered bytes
(``gathered_bytes``), and with ``after_forward`` ``regathered``; the partitioner's row after it
gives the saved bytes either way. A graph without all-gathers is untouched.
"""

from __future__ import annotations

from torch.fx import Node

from passkit import _torch
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program
from passkit.passes.partition_costs import is_free

__all__ = ["reshard"]


def _ancestors(roots: list[Node]) -> set[Node]:
    seen: set[Node] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.all_input_nodes)
    return seen


def _chain(wait: Node) -> list[Node]:
    """The wait and the views of its value (what the backward may read instead of the wait)."""
    chain, stack = [], [wait]
    while stack:
        node = stack.pop()
        if node not in chain:
            chain.append(node)
            stack.extend(u for u in node.users if u.op == "call_function" and is_free(u) and len(u.all_input_nodes) == 1)
    return chain


# Requires no fact: an overlay that puts its own partitioner, or another joint-graph step, right
# after ``joint`` (``after = "joint"``) keeps a pipeline that loads, and the step, finding no
# joint graph to choose in, says so instead of refusing the file.
@graph_pass("collectives.reshard", training_only=True)
def reshard(program: Program, *, after_forward: bool = False) -> bool:
    """Gather parameters again in the backward (after_forward) instead of saving them."""
    if "joint" not in program.graphs:
        if after_forward:
            program.record_stat("skipped", "no joint graph: put the step before the partitioner")
        return False
    gm = program.graphs["joint"]
    gathers = [n for n in gm.graph.nodes if _torch.collective_kind(n) == "all_gather" and len(n.users) == 1
               and _torch.is_wait(next(iter(n.users)))]
    if not gathers:
        return False
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    n_forward = program.io("joint").n_visible
    forward = _ancestors([a for a in output.args[0][:n_forward] if isinstance(a, Node)])
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    read_by_backward = []
    for gather in gathers:
        chain = _chain(next(iter(gather.users)))
        uses = [(x, u) for x in chain for u in x.users if u not in forward and u.op != "output" and u not in chain]
        if gather in forward and uses:
            read_by_backward.append((gather, chain, uses))
    program.record_stat("gathers", len(read_by_backward))
    program.record_stat("gathered_bytes", sum(_torch.collective_bytes(g) for g, _, _ in read_by_backward))
    if not after_forward or not read_by_backward:
        return False
    # Each gather again just before the backward's first read of it, in the forward's order.
    for gather, chain, uses in read_by_backward:
        first = min((u for _, u in uses), key=order.__getitem__)
        clones: dict[Node, Node] = {}
        with gm.graph.inserting_before(first):
            again = gm.graph.node_copy(gather)
            clones[chain[0]] = gm.graph.node_copy(chain[0], lambda a: again if a is gather else a)
            for node in chain[1:]:
                clones[node] = gm.graph.node_copy(node, lambda a: clones.get(a, a))
        for node, user in uses:
            user.replace_input_with(node, clones[node])
        for clone in reversed(list(clones.values())):  # views the backward does not read
            if not clone.users and clone is not clones[chain[0]]:
                gm.graph.erase_node(clone)
    gm.graph.lint()
    gm.recompile()
    program.record_stat("regathered", len(read_by_backward))
    return True


@hookimpl
def passkit_register_passes() -> list:
    return [reshard]
