"""Own the ``noops`` pattern set: ops that provably return their input unchanged.

A node is replaced by its input only when its ``meta["val"]`` equals the input's in shape,
strides, dtype and device, so no later op can tell the difference:

- ``view``, ``_unsafe_view``, ``reshape``, ``expand`` to the input's own shape, and ``alias``
  (in a functional graph nothing mutates, so an alias with identical metadata is the input);
- ``mul(x, 1)`` and ``div(x, 1)`` with a real Python scalar;
- ``sub(x, 0)`` (``x - (-0.0)`` turns ``-0.0`` into ``+0.0``, so only ``+0``), and ``add(x, -0.0)``
  or an integer/bool ``add(x, 0)`` (for floats ``-0.0 + 0`` is ``+0.0``).

What stays: a node the graph returns (the caller gets a fresh tensor in eager), complex
arithmetic (``(a + bj) * 1`` turns an infinite imaginary part into NaN), ``detach`` (it stops
gradients before ``joint``) and ``clone`` (it exists to give a fresh buffer).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from passkit.patterns.model import ANY, Alt, Op, Pattern, PatternSet, Var

__all__ = ["noops_set"]

aten = torch.ops.aten


def _real_scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not (
        isinstance(value, float) and math.isnan(value)
    )


def _times_one(other: Any, floating: bool) -> bool:
    return _real_scalar(other) and other == 1


def _minus_zero(other: Any, floating: bool) -> bool:
    return _real_scalar(other) and other == 0 and (not floating or math.copysign(1.0, other) > 0)


def _plus_zero(other: Any, floating: bool) -> bool:
    return _real_scalar(other) and other == 0 and (not floating or math.copysign(1.0, other) < 0)


def _identity_check(arithmetic: Callable[[Any, bool], bool] | None) -> Callable[[Any], bool]:
    def check(match: Any) -> bool:
        root = match.roots[0]
        if any(user.op == "output" for user in root.users):
            return False
        out, inp = root.meta.get("val"), match.val("x")
        if not isinstance(out, torch.Tensor) or not isinstance(inp, torch.Tensor):
            return False
        same = (
            tuple(out.shape) == tuple(inp.shape)
            and out.stride() == inp.stride()
            and out.dtype == inp.dtype
            and out.device == inp.device
        )
        if not same:
            return False
        if arithmetic is None:
            return True
        if out.dtype.is_complex or root.kwargs:
            return False
        return arithmetic(match.bindings["other"], out.dtype.is_floating_point)

    return check


def _keep_input(builder: Any, x: Any, **_: Any) -> Any:
    return x


def noops_set() -> PatternSet:
    patterns = []
    for name, ops in {
        "view": (aten.view.default,),
        "unsafe_view": (aten._unsafe_view.default,),
        "reshape": (aten.reshape.default,),
        "expand": (aten.expand.default,),
        "alias": (aten.alias.default,),
    }.items():
        for op in ops:
            search = Op(op, Var("x")) if op is aten.alias.default else Op(op, Var("x"), ANY)
            patterns.append(Pattern(name, search, build=_keep_input, check=_identity_check(None)))
    for name, ops, rule in (
        ("mul_one", (aten.mul.Tensor, aten.mul.Scalar), _times_one),
        # div.Tensor_mode rounds (floor(x / 1) != x for non-integers? it is x), but is left alone.
        ("div_one", (aten.div.Tensor, aten.div.Scalar), _times_one),
        ("sub_zero", (aten.sub.Tensor, aten.sub.Scalar), _minus_zero),
        ("add_zero", (aten.add.Tensor, aten.add.Scalar), _plus_zero),
    ):
        # One rule, one name: its overloads are alternatives of one search.
        search = Alt(*(Op(op, Var("x"), Var("other")) for op in ops))
        patterns.append(Pattern(name, search, build=_keep_input, check=_identity_check(rule)))
    return PatternSet("noops", tuple(patterns), "views to the same shape, x*1, x/1, x-0, x+(-0.0)")
