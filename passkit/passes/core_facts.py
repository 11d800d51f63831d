"""Own the built-in facts: ``captured``, ``functional``, ``decomposed``, ``joint``,
``partitioned`` and ``compiled``, each with its checker.

The checkers look into the subgraphs of higher-order ops too. An essential built-in plugin (it cannot be blocked, and is there even in a manager built
without the other built-ins): it registers these facts through ``passkit_register_facts``,
like any plugin registers its own. The rules about facts are ``passkit.core.facts``'.
"""

from __future__ import annotations

import operator
from typing import Any

from passkit import _torch
from passkit.core.facts import Fact
from passkit.core.hookspecs import hookimpl
from passkit.core.program import Program, TargetOpset

__all__ = ["passkit_register_facts"]

_NOT_OPERATORS = {operator.getitem, _torch.set_grad_enabled}


def _check_captured(program: Program) -> str | None:
    return None if program.graphs else "the program has no graphs"


def _check_functional(program: Program) -> str | None:
    found = [
        f"{graph_name}:{node.name} ({node.target})"
        for graph_name, gm in program.graphs.items()
        for sub in _torch.graph_and_subgraphs(gm)
        for node in sub.graph.nodes
        if _torch.mutates(node)
    ]
    return f"mutating ops remain: {', '.join(found[:5])}" if found else None


def _in_opset(target: TargetOpset, op: Any, *, before_joint: bool, training: bool = False) -> bool:
    if not isinstance(op, _torch.OpOverload):
        return True  # higher-order ops and Python callables are not ATen operators
    if op in target.kept or (before_joint and op in _torch.AUTOGRAD_SEMANTIC_OPS):
        return True
    if _torch.is_runtime_assert(op):
        return True  # torch's checks on a data-dependent size, kept as they are
    if _torch.is_collective(op):
        return True  # communication: no table lowers it (DTensor's backward adds all_reduce)
    if before_joint and training and _torch.has_own_autograd_formula(op):
        return True  # a training program's main keeps these for joint to lower (see decompose)
    if _torch.draws_random_numbers(op) and op not in target.table:
        return True  # decompose keeps random ops whole unless `extra` names them (see there)
    if "core_aten" in target.tables:
        return _torch.is_core_aten(op)
    # A decomposition that declined for these inputs (``mm`` on most CPU shapes) left its op
    # for the code generator, as torch's AOT leaves it for Inductor.
    return op not in target.table or _torch.decomposition_may_decline(target.table[op])


def _check_decomposed(program: Program) -> str | None:
    target = program.target_opset
    if target is None:
        return "no decompose step recorded a target opset"
    before_joint = "main" in program.graphs
    outside = sorted(
        {
            str(node.target)
            for gm in program.graphs.values()
            for sub in _torch.graph_and_subgraphs(gm)
            for node in sub.graph.nodes
            if node.op == "call_function"
            and node.target not in _NOT_OPERATORS
            and not _in_opset(target, node.target, before_joint=before_joint, training=program.training)
        }
    )
    return f"ops outside the target opset: {', '.join(outside[:8])}" if outside else None


def _check_joint(program: Program) -> str | None:
    if "joint" not in program.graphs:
        return f"no 'joint' graph (graphs: {', '.join(program.graphs)})"
    return None


def _check_partitioned(program: Program) -> str | None:
    missing = [g for g in ("forward", "backward") if g not in program.graphs]
    if missing:
        return f"missing graph(s): {', '.join(missing)}"
    return None


def _check_compiled(program: Program) -> str | None:
    missing = [g for g in program.graphs if g not in program.compiled]
    if missing:
        return f"graph(s) without a callable: {', '.join(missing)}"
    return None


def _discard_compiled(program: Program) -> None:
    program.compiled.clear()


@hookimpl
def passkit_register_facts() -> list[Fact]:
    """Every built-in fact."""
    return [
        Fact("captured", "graphs hold torch-level FX from Dynamo or make_fx", _check_captured),
        Fact("functional", "no op mutates; input mutations are recorded in the signature", _check_functional),
        Fact("decomposed", "every op is in the target opset of the chosen tables", _check_decomposed),
        Fact("joint", "one graph computes the outputs and the gradients, with tangent inputs", _check_joint),
        Fact("partitioned", "separate forward and backward graphs; saved values in the signature", _check_partitioned),
        Fact("compiled", "every graph has a callable", _check_compiled, tied_to_graphs=True, discard=_discard_compiled),
    ]
