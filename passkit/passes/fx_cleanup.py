"""Own the graph-hygiene passes every pipeline uses: dead-code and common-subexpression removal.

Both work on any graph, functional or not: nodes that mutate, draw random numbers or toggle grad
mode are never removed or merged. Both recurse into the subgraphs of higher-order ops (``cond``
branches, loop bodies, ``flex_attention``'s score functions), whose placeholders and outputs
stay as they are; a ``get_attr`` that a higher-order op reads is never removed, and a
higher-order op whose subgraphs draw random numbers is never merged.
"""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program

__all__ = ["dce", "cse"]


def _keeps(node: Node) -> bool:
    """Whether a node must stay even when nothing reads its result."""
    if _torch.mutates(node):
        return True
    try:
        return _torch.is_impure(node)
    except Exception:  # an exotic call_module: keep it rather than guess
        return True


def _eliminate_dead_code(gm: GraphModule) -> bool:
    removed = False
    for node in reversed(list(gm.graph.nodes)):
        if node.op in ("placeholder", "output") or node.users or _keeps(node):
            continue
        gm.graph.erase_node(node)
        removed = True
    if removed:
        gm.recompile()
    return removed


@graph_pass("fx.dce")
def dce(program: Program) -> bool:
    """Remove nodes whose results nobody reads (mutations and side effects stay)."""
    changed = False
    for gm in _every_graph(program):
        changed |= _eliminate_dead_code(gm)
    return changed


def _every_graph(program: Program) -> list[GraphModule]:
    """The program's graphs and their subgraphs, each once (forward and backward may share one)."""
    found: dict[int, GraphModule] = {}
    for gm in program.graphs.values():
        for sub in _torch.graph_and_subgraphs(gm):
            found.setdefault(id(sub), sub)
    return list(found.values())


def _cse_key(node: Node, replaced: dict[Node, Node]) -> Any:
    def canon(arg: Any) -> Any:
        if isinstance(arg, Node):
            return ("node", replaced.get(arg, arg).name)
        if isinstance(arg, (list, tuple)):
            return (type(arg).__name__, tuple(canon(a) for a in arg))
        if isinstance(arg, dict):
            return ("dict", tuple(sorted((k, canon(v)) for k, v in arg.items())))
        return ("const", type(arg).__name__, repr(arg))

    return (node.op, str(node.target), canon(node.args), canon(node.kwargs))


def _eliminate_common_subexpressions(gm: GraphModule) -> bool:
    seen: dict[Any, Node] = {}
    replaced: dict[Node, Node] = {}
    # A mutation can change what an earlier identical expression would compute.
    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method"):
            continue
        if _torch.mutates(node) or _torch.call_draws_random_numbers(node) or _keeps(node):
            seen.clear()
            continue
        key = _cse_key(node, replaced)
        twin = seen.get(key)
        if twin is None:
            seen[key] = node
            continue
        node.replace_all_uses_with(twin)
        replaced[node] = twin
        gm.graph.erase_node(node)
    if replaced:
        gm.recompile()
    return bool(replaced)


@graph_pass("fx.cse")
def cse(program: Program) -> bool:
    """Merge identical pure computations so each is computed once."""
    changed = False
    for gm in _every_graph(program):
        changed |= _eliminate_common_subexpressions(gm)
    return changed


@hookimpl
def passkit_register_passes() -> list:
    return [dce, cse]
