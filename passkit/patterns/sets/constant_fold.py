"""Own the ``constant_fold`` pattern set: a tensor operand of one uniform, constant value becomes
a Python scalar.

``x / torch.full([], 8.0)`` (GPT-2's attention scale), ``x * torch.ones(()) * 2`` and the like
compute a whole tensor of one value, from literals only, to feed an elementwise op. The operand
is evaluated at rewrite time (``constant_value``); when every element is the same, the op takes
that value as a scalar. The scalar is the tensor's own stored value, so the op computes exactly
what it did; a result of another shape or dtype (the constant broadcast ``x`` up, or promoted
it) is refused by the driver.
"""

from __future__ import annotations

from typing import Any

import torch

from passkit.patterns.constants import constant_value
from passkit.patterns.model import Op, Pattern, PatternSet, Var

__all__ = ["constant_fold_set"]

aten = torch.ops.aten
_MAX_ELEMENTS = 1 << 16


def _uniform(node: Any) -> float | int | bool | None:
    value = constant_value(node) if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.numel() == 0 or value.numel() > _MAX_ELEMENTS:
        return None
    if value.is_complex():
        return None
    first = value.reshape(-1)[0]
    if not bool((value == first).all()) or (value.is_floating_point() and bool(first.isnan())):
        return None
    return first.item()


def _foldable(x: Any, c: Any) -> bool:
    if not isinstance(c, torch.fx.Node) or not isinstance(x, torch.fx.Node):
        return False
    x_val, c_val = x.meta.get("val"), c.meta.get("val")
    if not isinstance(x_val, torch.Tensor) or not isinstance(c_val, torch.Tensor):
        return False
    # A scalar promotes like a 0-d tensor only when the tensor is 0-d or of x's dtype.
    if c_val.dim() != 0 and c_val.dtype != x_val.dtype:
        return False
    return _uniform(c) is not None


def _operands(x: Any, c: Any, commutative: bool) -> tuple[Any, Any] | None:
    """(tensor, constant), trying both orders for a commutative op; None if neither folds."""
    if _foldable(x, c):
        return x, c
    if commutative and _foldable(c, x):
        return c, x
    return None


def _make(op: Any, commutative: bool, with_alpha: bool) -> Pattern:
    args = (Var("x"), Var("c"), Var("alpha")) if with_alpha else (Var("x"), Var("c"))

    def swappable(alpha: Any) -> bool:
        # c + alpha * x is not x + alpha * c unless alpha is 1.
        return commutative and (not with_alpha or alpha == 1)

    def build(b: Any, x: Any, c: Any, alpha: Any = None) -> Any:
        tensor, constant = _operands(x, c, swappable(alpha))
        scalar = _uniform(constant)
        return b.call(op, tensor, scalar, alpha=alpha) if with_alpha else b.call(op, tensor, scalar)

    def check(match: Any) -> bool:
        bindings = match.bindings
        return _operands(bindings["x"], bindings["c"], swappable(bindings.get("alpha"))) is not None

    return Pattern(
        f"{op.overloadpacket.__name__}_uniform",
        Op(op, *args),
        build=build,
        check=check,
        description=f"{op} with a uniform constant tensor -> a scalar operand",
    )


def constant_fold_set() -> PatternSet:
    patterns = (
        _make(aten.mul.Tensor, True, False),
        _make(aten.div.Tensor, False, False),
        _make(aten.add.Tensor, True, True),
        _make(aten.sub.Tensor, False, True),
    )
    return PatternSet("constant_fold", patterns, "uniform constant tensors in elementwise ops -> scalars")
