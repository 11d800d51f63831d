"""Own ``decompose``: lower ops through named decomposition tables.

``tables`` names tables registered through ``passkit_register_decompositions`` (built in:
``core_aten``, torch's Core ATen decompositions, and ``full``, torch's whole post-autograd
table). ``keep`` leaves ops whole (aten often runs them faster whole); ``extra`` adds ops from
the full table. The pass works before or after ``joint``; after it, backward ops decompose too;
before it, ``joint`` lowers the backward through the same table. The target opset of
``core_aten`` is Core ATen (ops tagged ``core``, and prims); of other tables, every op they do
not decompose. Kept ops are in it too. The step leaves a ``TargetOpset`` on the program, and
the ``decomposed`` fact's checker (``passkit.passes.core_facts``) names any op outside it. Table names are checked
against the registry when the pipeline loads. Graphs are re-traced under functionalization, so
decompositions that use in-place ops keep the program functional.
"""

from __future__ import annotations

from typing import Any, Callable

import pydantic
import torch

from passkit import _torch
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program, TargetOpset

__all__ = ["decompose", "DecomposeOptions", "resolve_op", "main_table", "out_of_place_table"]

Table = dict[Any, Callable[..., Any]]
BUILTIN_TABLES: dict[str, Callable[[], Table]] = {"core_aten": _torch.core_aten_table, "full": _torch.full_table}


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


class TableName(str):
    """A decomposition table's name, carrying the factory the registry resolved it to."""

    factory: Callable[[], Table]


class DecomposeOptions(pydantic.BaseModel):
    """``tables`` are checked against the registry in the validation context (the one the
    pipeline loads with); without one, only the built-in tables are known."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    tables: list[str] = pydantic.Field(default=["core_aten"], validate_default=True)
    keep: list[str] = []
    extra: list[str] = []

    @pydantic.field_validator("keep", "extra")
    @classmethod
    def _known_ops(cls, names: list[str]) -> list[str]:
        for name in names:
            resolve_op(name)
        return names

    @pydantic.field_validator("tables", mode="after")
    @classmethod
    def _known_tables(cls, names: list[str], info: pydantic.ValidationInfo) -> list[str]:
        registry = (info.context or {}).get("registry")
        registered = registry.decompositions if registry is not None else BUILTIN_TABLES
        resolved = []
        for name in names:
            if name not in registered:
                known = ", ".join(sorted(registered)) or "none"
                raise ValueError(f"unknown decomposition table '{name}' (known: {known})")
            table_name = TableName(name)
            table_name.factory = registered[name]
            resolved.append(table_name)
        return resolved


def build_table(tables: list[TableName], keep: list[str], extra: list[str]) -> tuple[Table, set[Any]]:
    """One decomposition table: the named tables, plus ``extra`` ops, minus ``keep`` ops."""
    table: Table = {}
    for name in tables:
        table.update(name.factory())
    if extra:
        table.update(_torch.decompositions_for([resolve_op(n) for n in extra]))
    kept = {op for name in keep for op in _overloads(resolve_op(name))}
    random = {op for op in table if _draws_random_numbers(op)} - set(_torch.decompositions_for([resolve_op(n) for n in extra]))
    # Kept whole, a random op's gradient comes from its own backward op, which must stay whole too.
    kept |= random | {op for forward in random for op in _backward_ops(forward)}
    for op in kept:
        table.pop(op, None)
    return table, kept


def _backward_ops(op: Any) -> list[Any]:
    """The overloads of ``<op>_backward``, if ATen has such an op."""
    namespace, name = op.name().split("::")
    packet = getattr(getattr(torch.ops, namespace), f"{name}_backward", None)
    return _overloads(packet) if packet is not None else []


def _draws_random_numbers(op: Any) -> bool:
    """A random op (``bernoulli``, ``rrelu``, attention with dropout) stays whole.

    Its decomposition draws through other RNG calls (``rand_like < p``), so under the same seed
    the numbers would differ from eager's; whole, it draws exactly what eager draws, so dropout
    training is reproducible. ``extra`` can still name one to decompose.
    """
    return _torch.draws_random_numbers(op)


# (id of a table, which part) -> (the table, its part). A table is never changed once built
# (``_cached_table`` keeps one per step configuration for the process), so its parts are
# computed once: filtering the thousand-entry Core ATen table cost every compile of a small
# program a tenth of its time. The table is held so that its id cannot be reused.
_PARTS: dict[tuple[int, str], tuple[Any, Table]] = {}
_MAX_PARTS = 32  # tables handed in fresh each time would otherwise pile up


def _part(table: Any, which: str, keeps: Callable[[Any], bool]) -> Table:
    held = _PARTS.get((id(table), which))
    if held is not None and held[0] is table:
        return held[1]
    part = {op: fn for op, fn in table.items() if keeps(op)}
    if len(_PARTS) >= _MAX_PARTS:
        _PARTS.clear()
    _PARTS[(id(table), which)] = (table, part)
    return part


def main_table(table: Any, *, training: bool) -> Table:
    """The part of ``table`` that may lower ``main`` before ``joint`` differentiates it (shared:
    callers must not change it).

    ``joint`` lowers the rest after autograd ran: ops about autograd, not values (``detach``),
    and in a training program every op autograd differentiates by its own formula. Autograd
    must apply that formula, as in eager, not differentiate the decomposition, whose gradient
    can differ (NaN from ``special.log_ndtr``'s masked ``where`` branch). torch's AOT Autograd
    likewise decomposes below autograd.
    """
    if training:
        return _part(table, "main training", lambda op: op not in _torch.AUTOGRAD_SEMANTIC_OPS
                     and not _torch.has_own_autograd_formula(op))
    return _part(table, "main", lambda op: op not in _torch.AUTOGRAD_SEMANTIC_OPS)


def out_of_place_table(table: Any) -> Table:
    """The entries of ``table`` for ops that mutate nothing (shared: callers must not change it);
    ``joint``'s plain trace lowers through these."""
    return _part(table, "out of place", lambda op: not _torch.op_mutates(op))


def _lowered(gm: Any, table: dict[Any, Callable[..., Any]], *, functional: bool) -> Any:
    """Re-trace through ``table``; under functionalization only if a decomposition mutates.

    Most decompositions are functional, and the plain trace is about a third cheaper. A graph
    with no op to decompose is kept as it is: a training ``main`` usually has none (every op
    with its own autograd formula waits for ``joint``), and re-tracing it would only add the
    unused outputs of multi-output ops.
    """
    if _torch.nothing_to_decompose(gm, table):
        return gm
    lowered = _torch.retrace(gm, decompositions=table, functional=False)
    if functional and _torch.has_mutations(lowered):
        lowered = _torch.retrace(gm, decompositions=table, functional=True)
    return lowered


_TABLES: dict[tuple[Any, ...], tuple[Table, frozenset[Any]]] = {}


def _cached_table(tables: list[TableName], keep: list[str], extra: list[str]) -> tuple[Table, frozenset[Any]]:
    """Built once per set of factories and lists: building a table re-reads torch's registry."""
    key = (tuple((str(name), name.factory) for name in tables), tuple(keep), tuple(extra))
    cached = _TABLES.get(key)
    if cached is None:
        table, kept = build_table(tables, keep, extra)
        cached = _TABLES[key] = (table, frozenset(kept))
    return cached


@graph_pass("decompose", requires={"functional"}, produces={"decomposed"}, options=DecomposeOptions)
def decompose(program: Program, *, tables: list[TableName], keep: list[str], extra: list[str]) -> bool:
    """Lower ops through decomposition tables (Core ATen by default), keeping the ones listed."""
    table, kept = _cached_table(tables, keep, extra)
    target = TargetOpset(tuple(map(str, tables)), tuple(keep), tuple(extra), table=table, kept=kept)
    before = program.graph_hash()
    functional = "functional" in program.facts
    for name, gm in list(program.graphs.items()):
        graph_table = main_table(table, training=program.training) if name == "main" else table
        program.graphs[name] = _lowered(gm, graph_table, functional=functional)
    program.target_opset = target
    return program.graph_hash() != before


@hookimpl
def passkit_register_passes() -> list:
    return [decompose]


@hookimpl
def passkit_register_decompositions() -> dict[str, Callable[[], Table]]:
    return dict(BUILTIN_TABLES)

