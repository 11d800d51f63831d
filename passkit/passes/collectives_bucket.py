"""Own ``collectives.bucket``: functional collectives of one kind, group and dtype merged into
buckets of at most a byte cap each.

A post-partition pass: it works on ``forward`` and ``backward`` (or an inference program's
``main``), where SimpleFSDP-style programs hold one ``all_gather_into_tensor`` per parameter and
one ``reduce_scatter_tensor`` per gradient, and DDP-style ones an ``all_reduce`` per gradient.
Fewer, larger collectives pay each one's latency once. The merging is torch's own
(``torch/_inductor/fx_passes/bucketing.py``, through ``passkit._torch``): greedy in the order of
the waits, never merging a collective with one that depends on it, so every rank issues the same
collectives in the same order. The merged collective starts where its last member started;
``collectives.overlap`` moves it.

The caps are per kind (``all_gather_mb``, ``reduce_scatter_mb``, ``all_reduce_mb``; 0 or less
leaves a kind alone). They are small on purpose: one bucket of everything would leave the first layer's
compute waiting for every layer's parameters, and nothing for ``collectives.overlap`` to hide.
A graph without collectives is untouched (the pass returns False). The report row gives the
collectives per kind before and after (``all_gather=16->4``) and the bytes of each bucket (``buckets``, by graph and kind).
"""

from __future__ import annotations

from collections import Counter

from torch.fx import GraphModule

from passkit import _torch
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program

__all__ = ["bucket", "collective_graphs", "count_collectives"]

_MB = 1024 * 1024
# The graphs collectives are scheduled in: after partitioning, or an inference program's.
_GRAPHS = ("forward", "backward", "main")


def collective_graphs(program: Program) -> list[tuple[str, GraphModule]]:
    """The program's top-level graphs that hold a functional collective, in a fixed order."""
    return [(name, program.graphs[name]) for name in _GRAPHS
            if name in program.graphs and any(_torch.collective_kind(n) for n in program.graphs[name].graph.nodes)]


def count_collectives(gm: GraphModule) -> Counter[str]:
    return Counter(kind for n in gm.graph.nodes if (kind := _torch.collective_kind(n)))


@graph_pass("collectives.bucket")
def bucket(program: Program, *, all_gather_mb: float = 4.0, reduce_scatter_mb: float = 4.0,
           all_reduce_mb: float = 25.0) -> bool:
    """Merge collectives of one kind, group and dtype into buckets of at most a cap each (MiB)."""
    caps = {"all_gather": all_gather_mb, "reduce_scatter": reduce_scatter_mb, "all_reduce": all_reduce_mb}
    graphs = collective_graphs(program)
    if not graphs:
        return False
    before: Counter[str] = Counter()
    after: Counter[str] = Counter()
    bucket_bytes: dict[str, list[int]] = {}
    for name, gm in graphs:
        before += count_collectives(gm)
        for kind, cap in caps.items():
            if cap > 0:
                sizes = _torch.bucket_collectives(gm, kind, int(cap * _MB))
                if sizes:
                    bucket_bytes[f"{name}.{kind}"] = sizes
        after += count_collectives(gm)
    for kind in sorted(before):
        program.record_stat(kind, f"{before[kind]}->{after[kind]}")
    if bucket_bytes:
        program.record_stat("buckets", bucket_bytes)
    return bool(bucket_bytes)


@hookimpl
def passkit_register_passes() -> list:
    return [bucket]
