"""Own ``decompose``: lower ops through named decomposition tables.

``tables`` names tables registered through ``passkit_register_decompositions`` (built in:
``core_aten``, torch's Core ATen decompositions, and ``full``, torch's whole post-autograd
table). ``keep`` leaves ops whole (aten often runs them faster whole); ``extra`` adds ops from
the full table. The pass works before or after ``joint``; after it, backward ops decompose too;
before it, ``joint`` lowers the backward through the same table. The target opset of
``core_aten`` is Core ATen (ops tagged ``core``, and prims); of other tables, every op they do
not decompose. Kept ops are in it too. ``verify = "facts"`` names any op outside it.
Graphs are re-traced under functionalization, so decompositions that use in-place ops keep the
program functional.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pydantic
import torch

from passkit import _torch
from passkit.hookspecs import hookimpl
from passkit.pass_api import graph_pass
from passkit.program import Program

__all__ = ["decompose", "DecomposeOptions", "TargetOpset", "resolve_op"]


def resolve_op(name: str) -> Any:
    """``"aten.gelu.default"`` → the OpOverload; ``"aten.gelu"`` → the overload packet."""
    parts = name.split(".")
    if len(parts) not in (2, 3):
        raise ValueError(f"'{name}' is not an op name like 'aten.gelu.default'")
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        return getattr(packet, parts[2]) if len(parts) == 3 else packet
    except (AttributeError, RuntimeError):
        raise ValueError(f"unknown op '{name}'") from None


def _overloads(op: Any) -> list[Any]:
    if isinstance(op, _torch.OpOverloadPacket):
        return [getattr(op, name) for name in op.overloads()]
    return [op]


class DecomposeOptions(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    tables: list[str] = ["core_aten"]
    keep: list[str] = []
    extra: list[str] = []

    @pydantic.field_validator("keep", "extra")
    @classmethod
    def _known_ops(cls, names: list[str]) -> list[str]:
        for name in names:
            resolve_op(name)
        return names


def build_table(
    tables: list[str], keep: list[str], extra: list[str], *, registry: Any = None
) -> tuple[dict[Any, Callable[..., Any]], set[Any]]:
    """One decomposition table: the named tables, plus ``extra`` ops, minus ``keep`` ops."""
    registered = (registry or _registry()).decompositions
    table: dict[Any, Callable[..., Any]] = {}
    for name in tables:
        if name not in registered:
            known = ", ".join(sorted(registered)) or "none"
            raise ValueError(f"unknown decomposition table '{name}' (known: {known})")
        table.update(registered[name]())
    if extra:
        table.update(_torch.decompositions_for([resolve_op(n) for n in extra]))
    kept = {op for name in keep for op in _overloads(resolve_op(name))}
    for op in kept:
        table.pop(op, None)
    return table, kept


# Ops whose meaning is about autograd, not values. ``main`` is differentiated later by ``joint``,
# so lowering them there (detach -> alias) would let gradients through; ``joint`` lowers them
# after autograd has applied them.
_AUTOGRAD_SEMANTICS = frozenset({torch.ops.aten.detach.default})


def _without_autograd_ops(table: dict[Any, Callable[..., Any]]) -> dict[Any, Callable[..., Any]]:
    return {op: fn for op, fn in table.items() if op not in _AUTOGRAD_SEMANTICS}


def _is_core(op: Any) -> bool:
    """In the Core ATen opset: tagged ``core``, or a prim."""
    return op.namespace == "prims" or torch.Tag.core in op.tags


def _lowered(gm: Any, table: dict[Any, Callable[..., Any]], *, functional: bool) -> Any:
    """Re-trace through ``table``; under functionalization only if a decomposition mutates.

    Most decompositions are functional, and the plain trace is about a third cheaper.
    """
    lowered = _torch.retrace(gm, decompositions=table, functional=False)
    if functional and _torch.has_mutations(lowered):
        lowered = _torch.retrace(gm, decompositions=table, functional=True)
    return lowered


@dataclass(frozen=True)
class TargetOpset:
    """What a ``decompose`` step lowered to, by name only, so a program stays serializable.

    ``joint`` rebuilds the table from it to lower the backward the same way, and the
    ``decomposed`` fact's checker asks it which ops belong.
    """

    tables: tuple[str, ...]
    keep: tuple[str, ...]
    extra: tuple[str, ...]

    def table(self) -> dict[Any, Callable[..., Any]]:
        return _cached_table(self, _registry())[0]

    def contains(self, op: Any, *, before_joint: bool) -> bool:
        if not isinstance(op, _torch.OpOverload):
            return True  # getitem, grad-mode switches, higher-order ops: not ATen operators
        table, kept = _cached_table(self, _registry())
        if op in kept or (before_joint and op in _AUTOGRAD_SEMANTICS):
            return True
        if "core_aten" in self.tables:
            return _is_core(op)
        return op not in table


def _registry() -> Any:
    from passkit.registry import get_registry

    return get_registry()


_TABLES: dict[TargetOpset, tuple[Any, dict[Any, Callable[..., Any]], frozenset[Any]]] = {}


def _cached_table(spec: TargetOpset, registry: Any) -> tuple[dict[Any, Callable[..., Any]], frozenset[Any]]:
    """Built once per registry: a plugin registered later may define a table of the same name."""
    cached = _TABLES.get(spec)
    if cached is None or cached[0] is not registry:
        table, kept = build_table(list(spec.tables), list(spec.keep), list(spec.extra), registry=registry)
        cached = _TABLES[spec] = (registry, table, frozenset(kept))
    return cached[1], cached[2]


@graph_pass("decompose", requires={"functional"}, produces={"decomposed"}, options=DecomposeOptions)
def decompose(program: Program, *, tables: list[str], keep: list[str], extra: list[str]) -> bool:
    """Lower ops through decomposition tables (Core ATen by default), keeping the ones listed."""
    target = TargetOpset(tuple(tables), tuple(keep), tuple(extra))
    table = target.table()
    before = program.graph_hash()
    functional = "functional" in program.facts
    for name, gm in list(program.graphs.items()):
        graph_table = _without_autograd_ops(table) if name == "main" else table
        program.graphs[name] = _lowered(gm, graph_table, functional=functional)
    program.notes["target_opset"] = target
    return program.graph_hash() != before


@hookimpl
def passkit_register_passes() -> list:
    return [decompose]


@hookimpl
def passkit_register_decompositions() -> dict[str, Callable[[], dict[Any, Callable[..., Any]]]]:
    return {"core_aten": _torch.core_aten_table, "full": _torch.full_table}
