"""Own the steps of an ``edge`` pipeline that only ExecuTorch's path has: ``edge.lower`` (the
program in ExecuTorch's Edge dialect), ``edge.contiguous`` (every tensor in the layout the
runtime's kernels take) and ``edge.delegate`` (parts of the program handed to a backend such as
XNNPACK), with the facts ``edge`` and ``delegated`` they produce.

``edge.lower`` and ``edge.delegate`` rebuild the ``ExportedProgram`` and hand it to ExecuTorch;
``passkit.to_executorch`` leaves the way to do that in ``program.notes[EDGE_NOTE]`` (an object
with ``lower(program)`` and ``delegate(program)``), so these passes run only there, and in the
tools that capture a program as it does (``bisect``, reproducers). Steps placed before
``edge.lower`` see ATen ops, as in an ``export`` pipeline; steps after it see Edge ops
(``exir_ops.edge.aten...``), which call the same ATen kernels when the graph runs in Python.
"""

from __future__ import annotations

from typing import Any

from passkit import _torch
from passkit.core.facts import Fact
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program
from passkit.errors import PasskitError

__all__ = ["EDGE_NOTE", "contiguous", "delegate", "lower"]

EDGE_NOTE = "passkit.to_executorch"  # program.notes key: the frontend's way to ExecuTorch and back


def _bridge(program: Program, step: str) -> Any:
    bridge = program.notes.get(EDGE_NOTE)
    if bridge is None:
        raise PasskitError(
            f"{step} hands the program to ExecuTorch, which only passkit.to_executorch (or `passkit export "
            "--executorch`) sets up; run it in a pipeline with kind = \"edge\" through those"
        )
    return bridge


@graph_pass("edge.lower", requires={"functional"}, produces={"edge"})
def lower(program: Program) -> bool:
    """Lower the program to ExecuTorch's Edge dialect (``executorch.exir.to_edge``)."""
    _bridge(program, "edge.lower").lower(program)
    return True


@graph_pass("edge.delegate", requires={"edge"}, produces={"delegated"})
def delegate(program: Program, *, partitioners: list[str] = ["xnnpack"]) -> bool:  # noqa: B006 - options are frozen
    """Hand what the backends take (XNNPACK by default) to them: delegated calls in the graph.

    ``partitioners`` name ExecuTorch's partitioners, each in turn (``[]``: none; the runtime's
    portable kernels run every op)."""
    unknown = [name for name in partitioners if name not in _torch.EDGE_PARTITIONERS]
    if unknown:
        raise PasskitError(f"edge.delegate: unknown partitioner {unknown[0]!r}; passkit knows {', '.join(_torch.EDGE_PARTITIONERS)}")
    return bool(_bridge(program, "edge.delegate").delegate(program, tuple(partitioners)))


@graph_pass("edge.contiguous", requires={"edge"})
def contiguous(program: Program) -> bool:
    """Allocate every tensor in the default dim order, whose kernels the runtime has.

    A program decomposed from a kernel that follows its input's layout (attention's output
    laid out like the query) allocates with ``empty_strided`` in a permuted order; ExecuTorch's
    runtime has no ``empty_strided`` kernel for it ("kernel 'aten::empty_strided.out' not
    found", dim order [0, 2, 1, 3]). In the Edge dialect every view is a copy, so the layout
    changes no value: the allocation becomes ``_empty_dim_order`` in the default order, and the
    values after it are traced again so the layouts the runtime is told follow.
    """
    changed = False
    for gm in program.graphs.values():
        found = [n for n in gm.graph.nodes if n.op == "call_function" and _torch.is_edge_empty_strided(n.target)]
        for node in found:
            size = node.args[0]
            with gm.graph.inserting_before(node):
                empty = gm.graph.call_function(
                    _torch.edge_empty_contiguous(), (size,),
                    {"dtype": node.kwargs.get("dtype"), "dim_order": list(range(len(size)))},
                )
            empty.meta.update(node.meta)
            node.replace_all_uses_with(empty)
            gm.graph.erase_node(node)
        if found:
            gm.recompile()
            problem = _torch.propagate_fake_values(gm)
            if problem:
                raise PasskitError(f"edge.contiguous: the graph does not trace with contiguous allocations: {problem}")
            changed = True
    return changed


def _check_edge(program: Program) -> str | None:
    plain = [name for name, gm in program.graphs.items() if not _torch.edge_ops_in(gm)]
    return f"graph {plain[0]!r} calls no Edge-dialect op" if plain else None


@hookimpl
def passkit_register_passes() -> list:
    return [lower, contiguous, delegate]


@hookimpl
def passkit_register_facts() -> list[Fact]:
    return [
        Fact("edge", "graphs call ExecuTorch's Edge-dialect ops (executorch.exir.to_edge)", _check_edge),
        Fact("delegated", "the Edge program went through its backends' partitioners", None),
    ]
