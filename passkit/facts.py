"""Own the facts: named states of a program that passes rely on, and a checker for each.

``passkit validate`` checks contracts against the table below; with ``verify`` on, the runner
re-checks every established fact after each step so the step that broke one is named.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from passkit import _torch

if TYPE_CHECKING:
    from passkit.program import Program

__all__ = ["Fact", "FACTS", "check_fact", "mutating_nodes", "ops_outside_opset"]


@dataclass(frozen=True)
class Fact:
    name: str
    meaning: str
    produced_by: str


FACTS: dict[str, Fact] = {
    f.name: f
    for f in (
        Fact("captured", "graphs hold torch-level FX from Dynamo or make_fx", "capture"),
        Fact("functional", "no op mutates; input mutations are recorded in the signature", "functionalize"),
        Fact("decomposed", "every op is in the target opset of the chosen tables", "decompose"),
        Fact("joint", "one graph computes the outputs and the gradients, with tangent inputs", "joint"),
        Fact("partitioned", "separate forward and backward graphs; saved values in the signature", "partition.*"),
        Fact("compiled", "every graph has a callable", "codegen.*"),
    )
}

_ALLOWED_CALLABLES = {operator.getitem, _torch.set_grad_enabled}


def mutating_nodes(program: Program) -> list[str]:
    """Describe every node whose op mutates an argument (schema with a mutable alias)."""
    found = []
    for graph_name, gm in program.graphs.items():
        for node in gm.graph.nodes:
            if node.op == "call_method" and str(node.target).endswith("_"):
                found.append(f"{graph_name}:{node.name} ({node.target})")
            elif node.op == "call_function" and isinstance(node.target, _torch.OpOverload):
                if node.target._schema.is_mutable:
                    found.append(f"{graph_name}:{node.name} ({node.target})")
    return found


def ops_outside_opset(program: Program) -> list[str]:
    """Ops outside the target opset that the last ``decompose`` step recorded (``target_opset``)."""
    target = program.notes.get("target_opset")
    if target is None:
        return []
    before_joint = "main" in program.graphs
    outside = []
    for gm in program.graphs.values():
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target in _ALLOWED_CALLABLES:
                continue
            if not target.contains(node.target, before_joint=before_joint):
                outside.append(str(node.target))
    return sorted(set(outside))


def _check_functional(program: Program) -> str | None:
    found = mutating_nodes(program)
    if found:
        return f"mutating ops remain: {', '.join(found[:5])}"
    return None


def _check_decomposed(program: Program) -> str | None:
    outside = ops_outside_opset(program)
    if outside:
        return f"ops outside the target opset: {', '.join(outside[:8])}"
    return None


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


_CHECKERS: dict[str, Callable[[Program], str | None]] = {
    "functional": _check_functional,
    "decomposed": _check_decomposed,
    "joint": _check_joint,
    "partitioned": _check_partitioned,
    "compiled": _check_compiled,
}


def check_fact(program: Program, fact: str) -> str | None:
    """Return why ``fact`` does not hold for ``program``, or None when it holds.

    Facts without a structural checker (``captured`` and plugin-defined facts) always hold.
    """
    checker = _CHECKERS.get(fact)
    return checker(program) if checker else None
