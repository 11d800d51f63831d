"""Own which size symbols a graph value needs and which it binds, for a graph that takes it as
an input, and where each bound one is read in a call's inputs.

A compiled graph binds each symbolic size it reads from its inputs: a ``SymInt`` input whose
value is a plain symbol (``s95``), or a tensor input with a plain symbol among its sizes or
strides. A size written as an expression (``s75*s95``, a flattened view) binds nothing, so a
graph that takes such a tensor needs each of its symbols from another input; Inductor stops
otherwise ("expected [s95] to have been codegen-ed").
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SymbolSource", "at_least_all", "read_symbol", "symbol_sources", "symbols_bound", "symbols_needed"]

# (symbol, input index, "int" | "size" | "stride" | "offset", dimension)
SymbolSource = tuple[Any, int, str, int]


def _sizes(value: Any) -> list[Any]:
    if isinstance(value, torch.SymInt):
        return [value]
    if isinstance(value, torch.Tensor):
        return [*value.shape, *value.stride(), value.storage_offset()]
    return []


def symbols_needed(value: Any) -> set[Any]:
    """The free symbols of ``value``'s sizes (or of the ``SymInt`` itself)."""
    return {s for size in _sizes(value) if isinstance(size, torch.SymInt) for s in size.node.expr.free_symbols}


def symbols_bound(value: Any) -> set[Any]:
    """The symbols a graph binds when it takes ``value`` as an input."""
    return {
        size.node.expr
        for size in _sizes(value)
        if isinstance(size, torch.SymInt) and getattr(size.node.expr, "is_Symbol", False)
    }


def symbol_sources(inputs: list[Any]) -> dict[Any, SymbolSource]:
    """Where each plain size symbol the ``inputs`` bind can be read in a call's real inputs: a
    ``SymInt`` input itself, or one size, stride or the storage offset of a tensor input."""
    found: dict[Any, SymbolSource] = {}

    def note(value: Any, index: int, kind: str, dim: int) -> None:
        if isinstance(value, torch.SymInt) and getattr(value.node.expr, "is_Symbol", False):
            found.setdefault(value.node.expr, (value.node.expr, index, kind, dim))

    for index, value in enumerate(inputs):
        if isinstance(value, torch.SymInt):
            note(value, index, "int", 0)
        elif isinstance(value, torch.Tensor):
            for dim, size in enumerate(value.shape):
                note(size, index, "size", dim)
            for dim, stride in enumerate(value.stride()):
                note(stride, index, "stride", dim)
            note(value.storage_offset(), index, "offset", 0)
    return found


def read_symbol(source: SymbolSource, inputs: Any) -> int:
    """The value a call's real ``inputs`` give the symbol ``source`` names."""
    _, index, kind, dim = source
    value = inputs[index]
    if kind == "int":
        return int(value)
    if kind == "size":
        return value.size(dim)
    if kind == "stride":
        return value.stride(dim)
    return value.storage_offset()



def at_least_all(values: list[Any]) -> Any:
    """The value among ``values`` (ints or ``SymInt``s) that is at least each other at the sizes
    traced, guarded so (a size where it is not compiles anew); ``None`` where a value has no
    size to trace it at (a data-dependent one)."""
    def hint(value: Any) -> Any:
        return value.node.hint if isinstance(value, torch.SymInt) else int(value)

    if any(hint(v) is None for v in values):
        return None
    furthest = max(values, key=hint)
    for other in values:
        bool(furthest >= other)  # installs the guard where it is not known already
    return furthest
