"""Own which size symbols a graph value needs and which it binds, for a graph that takes it as
an input.

A compiled graph binds each symbolic size it reads from its inputs: a ``SymInt`` input whose
value is a plain symbol (``s95``), or a tensor input with a plain symbol among its sizes or
strides. A size written as an expression (``s75*s95``, a flattened view) binds nothing, so a
graph that takes such a tensor needs each of its symbols from another input; Inductor stops
otherwise ("expected [s95] to have been codegen-ed").
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["symbols_bound", "symbols_needed"]


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
