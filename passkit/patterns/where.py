"""Own ``Where`` predicates: does a value satisfy one, and if not, which constraint fails.

The matcher asks ``where_miss`` both to decide a match and to explain a miss, so the reason a
nearest miss gives ("x has dtype float64, the pattern wants float32") is the constraint that
actually rejected the value.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Node

from passkit.patterns.model import Where

__all__ = ["where_miss"]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _either(wanted: Any, show: Any = str) -> str:
    options = wanted if isinstance(wanted, tuple) else (wanted,)
    return " or ".join(show(option) for option in options)


def _shape_miss(where_shape: tuple[Any, ...], val: torch.Tensor, sizes: dict[str, Any]) -> str | None:
    shape = f"has shape {list(val.shape)}, the pattern wants {list(where_shape)}"
    if len(where_shape) != val.dim():
        return shape
    for want, size in zip(where_shape, val.shape):
        if want is None:
            continue
        if isinstance(want, str):
            if want not in sizes:
                sizes[want] = size
            elif sizes[want] != size:
                return f"{shape} with {want} = {sizes[want]} as elsewhere in the match"
        elif want != size:
            return shape
    return None


def where_miss(where: Where, value: Any, sizes: dict[str, Any]) -> str | None:
    """The first constraint of ``where`` that ``value`` (a node, through its ``meta["val"]``, or a
    literal) fails, worded to follow the value's name: "has dtype float64, the pattern wants
    float32". None when every constraint holds; named sizes are then bound in ``sizes``."""
    val = value.meta.get("val") if isinstance(value, Node) else value
    if not isinstance(val, torch.Tensor):
        if where.dtype is not None or where.rank is not None or where.shape is not None:
            found = f"node {value.name}" if isinstance(value, Node) else repr(value)
            return f"is {found}, not the tensor the pattern wants"
    elif where.dtype is not None and val.dtype not in (where.dtype if isinstance(where.dtype, tuple) else (where.dtype,)):
        return f"has dtype {_dtype_name(val.dtype)}, the pattern wants {_either(where.dtype, _dtype_name)}"
    elif where.rank is not None and val.dim() not in (where.rank if isinstance(where.rank, tuple) else (where.rank,)):
        return f"has rank {val.dim()}, the pattern wants {_either(where.rank)}"
    elif where.shape is not None and (shape := _shape_miss(where.shape, val, sizes)) is not None:
        return shape
    if where.check is not None and not where.check(val):
        return "is rejected by the pattern's where check"
    return None
