"""Own the functional collectives' side of torch: which nodes start a collective or wait for one,
and torch's FX bucketing (``torch/_inductor/fx_passes/bucketing.py``) that merges them.

``collectives.bucket`` and ``collectives.overlap`` read graphs through these helpers only.
"""

from __future__ import annotations

import heapq
from typing import Any

import torch
from torch.fx import GraphModule, Node

from passkit._torch.graph_passes import propagate_fake_values
from passkit._torch.hops import subgraphs_traced_in

__all__ = ["COLLECTIVE_KINDS", "collective_kind", "is_wait", "collective_bytes", "bucket_collectives"]

_c10d = torch.ops._c10d_functional

# The kinds passkit buckets, by the op that starts them.
COLLECTIVE_KINDS: dict[str, tuple[Any, ...]] = {
    "all_gather": (_c10d.all_gather_into_tensor.default, _c10d.all_gather_into_tensor_out.default),
    "reduce_scatter": (_c10d.reduce_scatter_tensor.default,),
    "all_reduce": (_c10d.all_reduce.default,),
}
_KIND_OF = {op: kind for kind, ops in COLLECTIVE_KINDS.items() for op in ops}
_OTHER_STARTS = (_c10d.all_to_all_single.default, _c10d.all_gather_into_tensor_coalesced.default,
                 _c10d.reduce_scatter_tensor_coalesced.default, _c10d.all_reduce_coalesced.default,
                 _c10d.broadcast.default)


def collective_kind(node: Node) -> str:
    """``all_gather``, ``reduce_scatter``, ``all_reduce``, ``other`` (a collective passkit does not
    bucket), or ``""`` for a node that starts no collective."""
    if node.op != "call_function":
        return ""
    kind = _KIND_OF.get(node.target)
    if kind:
        return kind
    return "other" if node.target in _OTHER_STARTS else ""


def is_wait(node: Node) -> bool:
    return node.op == "call_function" and node.target is _c10d.wait_tensor.default


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        numel = value.numel()
        return int(numel if isinstance(numel, int) else numel.node.hint or 0) * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def collective_bytes(node: Node) -> int:
    """The larger of what a collective sends and what it receives (torch's bucket measure)."""
    first = node.args[0] if node.args else None  # what is sent; an ``_out`` variant's buffer is not
    sent = _bytes(first.meta.get("val")) if isinstance(first, Node) else 0
    return max(sent, _bytes(node.meta.get("val")))


def _only_waited_once(gm: GraphModule, kind: str) -> bool:
    # torch's merge replaces each collective's single wait; anything else it asserts on.
    return all(len(n.users) == 1 and is_wait(next(iter(n.users)))
               for n in gm.graph.nodes if collective_kind(n) == kind)


def _one_fake_mode(gm: GraphModule) -> Any:
    """The fake mode of the graph's values; derived again if they hold values of two modes."""
    from torch._subclasses.fake_tensor import FakeTensor

    modes = {v.fake_mode for n in gm.graph.nodes for v in [n.meta.get("val")] if isinstance(v, FakeTensor)}
    if len(modes) > 1:
        error = propagate_fake_values(gm)
        if error:
            raise RuntimeError(f"fake values of the graph could not be derived again: {error}")
        modes = {v.fake_mode for n in gm.graph.nodes for v in [n.meta.get("val")] if isinstance(v, FakeTensor)}
    return next(iter(modes), None)


def bucket_collectives(gm: GraphModule, kind: str, cap_bytes: int) -> list[int]:
    """Merge ``kind`` collectives of one group, reduce op and dtype into buckets of at most
    ``cap_bytes`` each (torch's greedy bucketing, in wait order, never across a dependency).

    Returns the bytes of each merged bucket; the graph is untouched when it returns ``[]``.
    """
    if not any(collective_kind(n) == kind for n in gm.graph.nodes) or not _only_waited_once(gm, kind):
        return []
    # torch traces each merge in the mode ``detect_fake_mode`` finds, which prefers Dynamo's
    # tracing context (active while a backend compiles) to the values' own.
    with subgraphs_traced_in(_one_fake_mode(gm)):
        return _bucket(gm, kind, cap_bytes)


def _bucket(gm: GraphModule, kind: str, cap_bytes: int) -> list[int]:
    from torch._inductor.fx_passes import bucketing

    cap = lambda _index: cap_bytes / (1024 * 1024)  # noqa: E731  (torch asks per bucket index)
    if kind == "all_gather":
        buckets = bucketing.bucket_all_gather_by_mb(gm, cap, None, "default")
    elif kind == "reduce_scatter":
        buckets = bucketing.bucket_reduce_scatter_by_mb(gm, cap, None, "default")
    else:
        buckets = bucketing.bucket_all_reduce_by_mb(gm, cap)
    if not buckets:
        return []
    sizes = [sum(collective_bytes(n) for n in bucket) for bucket in buckets]
    if kind == "all_gather":
        bucketing.merge_all_gather(gm, buckets, "default")
    elif kind == "reduce_scatter":
        bucketing.merge_reduce_scatter(gm, buckets, "default")
    else:
        for bucket in buckets:
            bucketing.merge_all_reduce_bucket(gm.graph, bucket, "default")
    _stable_topological_sort(gm)
    gm.graph.lint()
    gm.recompile()
    return sizes


def _stable_topological_sort(gm: GraphModule) -> None:
    """Order the graph so every node follows its inputs, moving as few nodes as possible.

    torch sorts only the span between a merged collective's inputs and itself; a member whose
    wait was read before that span (a gather repeated for the backward) leaves a reader ahead
    of its new value.
    """
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    missing = {n: len(set(n.all_input_nodes)) for n in nodes}
    ready = [index[n] for n in nodes if missing[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        node = nodes[heapq.heappop(ready)]
        order.append(node)
        for user in node.users:
            missing[user] -= 1
            if missing[user] == 0:
                heapq.heappush(ready, index[user])
    if order == nodes:
        return
    anchor = None
    for node in order:
        if anchor is not None and anchor.next is not node:
            anchor.append(node)
        anchor = node
