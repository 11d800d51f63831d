"""Own program snapshots: a copy of a ``Program`` that the steps run after it cannot change.

Passes edit graphs in place, so a snapshot copies every graph's nodes (``Graph.graph_copy``,
which shares node metadata such as fake values instead of deep-copying it) and the mutable
bookkeeping (signature, facts, notes, compiled callables). Fake inputs, the fake mode and the
target opset are shared: no pass changes them in place. This is what a reproducer records before
each step and what bisection restarts every trial from.
"""

from __future__ import annotations

import copy
import dataclasses

from torch import fx

from passkit import _torch
from passkit.core.program import Program

__all__ = ["copy_graph_module", "snapshot_program"]


def copy_graph_module(gm: fx.GraphModule) -> fx.GraphModule:
    """A new ``GraphModule`` over a copy of ``gm``'s graph, with the same attributes and codegen."""
    graph = fx.Graph()
    output = graph.graph_copy(gm.graph, {})
    graph.output(output)
    graph.set_codegen(copy.copy(_torch.graph_codegen(gm.graph)))
    copied = fx.GraphModule(gm, graph)
    copied.meta.update(gm.meta)
    # graph_copy gives the output node a fresh metadata dict; keep what the original carried.
    old_output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    new_output = next(n for n in reversed(graph.nodes) if n.op == "output")
    new_output.meta.update(old_output.meta)
    return copied


def snapshot_program(program: Program) -> Program:
    """A copy of ``program`` that is unaffected by later edits to the original."""
    return dataclasses.replace(
        program,
        graphs={name: copy_graph_module(gm) for name, gm in program.graphs.items()},
        signature=copy.deepcopy(program.signature),
        facts=set(program.facts),
        compiled=dict(program.compiled),
        notes=dict(program.notes),
        stats={},
        _hash_cache=None,
    )
