"""Own ``codegen.python``: turn every graph into a plain Python callable.

The callable is FX-generated Python for a copy of the graph, called directly rather than through
``nn.Module.__call__``. With ``fast_calls`` (the default), common ATen ops are emitted as the
ordinary torch function or tensor method that runs the same kernel: calling an ``OpOverload``
object costs about twice as much Python per call, which dominates small graphs on the CPU. The
program's graphs themselves are left as they are. Later stages (memory planning, fused regions
run in Python) extend this module.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.fx import Graph, GraphModule

from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program

__all__ = ["codegen_python", "fast_call_graph"]

aten = torch.ops.aten

# Each entry has the same positional arguments and keyword names as the ATen overload.
_AS_METHOD: dict[Any, str] = {
    aten.view.default: "view",
    aten._unsafe_view.default: "view",
    aten.permute.default: "permute",
    aten.t.default: "t",
    aten.transpose.int: "transpose",
    aten.unsqueeze.default: "unsqueeze",
    aten.squeeze.dim: "squeeze",
    aten.expand.default: "expand",
    aten.select.int: "select",
}
_AS_FUNCTION: dict[Any, Callable[..., Any]] = {
    aten.mm.default: torch.mm,
    aten.bmm.default: torch.bmm,
    aten.addmm.default: torch.addmm,
    aten.add.Tensor: torch.add,
    aten.sub.Tensor: torch.sub,
    aten.mul.Tensor: torch.mul,
    aten.div.Tensor: torch.div,
    aten.neg.default: torch.neg,
    aten.exp.default: torch.exp,
    aten.tanh.default: torch.tanh,
    aten.relu.default: torch.relu,
    aten.sigmoid.default: torch.sigmoid,
    aten.where.self: torch.where,
    aten.clone.default: torch.clone,
    aten.sum.dim_IntList: torch.sum,
    aten.mean.dim: torch.mean,
}
# Keyword arguments the ATen overloads take that the torch equivalents do not.
_UNSUPPORTED_KWARGS = {"implicit"}


def fast_call_graph(gm: GraphModule) -> GraphModule:
    """A copy of ``gm`` whose common ATen calls are emitted as torch functions and methods."""
    graph = Graph()
    env: dict[Any, Any] = {}
    output = graph.graph_copy(gm.graph, env)
    graph.output(output)
    for node in graph.nodes:
        if node.op != "call_function" or _UNSUPPORTED_KWARGS & set(node.kwargs):
            continue
        if node.target in _AS_METHOD:
            node.op, node.target = "call_method", _AS_METHOD[node.target]
        elif node.target in _AS_FUNCTION:
            node.target = _AS_FUNCTION[node.target]
    return GraphModule(gm, graph)


@graph_pass("codegen.python", produces={"compiled"})
def codegen_python(program: Program, *, fast_calls: bool = True) -> bool:
    """Compile every graph to Python code (common ATen ops as plain torch calls)."""
    for name, gm in program.graphs.items():
        if fast_calls:
            runnable = fast_call_graph(gm)  # a new GraphModule: compiled on construction
        else:
            runnable = gm
            runnable.recompile()
        program.compiled[name] = runnable.forward
    return False


@hookimpl
def passkit_register_passes() -> list:
    return [codegen_python]
