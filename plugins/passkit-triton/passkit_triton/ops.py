"""Own the op table: which ATen ops may join a fusion region, their family, and their Triton text.

``fuse.regions`` asks :func:`family_of` whether a node may fuse (and under which option name);
``codegen.triton`` asks :func:`triton_expression` for the expression that computes it inside a
kernel. Keeping both answers in one table means the fuser never puts an op in a region that the
code generator cannot write.

Reductions are listed separately (:data:`REDUCTIONS`) because the kernel writes them as
statements over a whole row, not as one expression.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch.fx import Node

__all__ = [
    "FAMILIES",
    "NAN_RULE",
    "REDUCTIONS",
    "family_of",
    "literal",
    "reduction_dims_are_last",
    "triton_expression",
]

aten = torch.ops.aten
prims = torch.ops.prims

Emit = Callable[[list[str], Node], "str | None"]


def _binary(symbol: str) -> Emit:
    return lambda a, node: f"({a[0]} {symbol} {a[1]})"


def _call(function: str) -> Emit:
    return lambda a, node: f"{function}({', '.join(a[:1])})"


def _add(a: list[str], node: Node) -> str | None:
    alpha = node.kwargs.get("alpha", 1)
    return f"({a[0]} + {a[1]})" if alpha == 1 else f"({a[0]} + {literal(alpha)} * {a[1]})"


def _sub(a: list[str], node: Node) -> str | None:
    alpha = node.kwargs.get("alpha", 1)
    return f"({a[0]} - {a[1]})" if alpha == 1 else f"({a[0]} - {literal(alpha)} * {a[1]})"


def _div(a: list[str], node: Node) -> str | None:
    # Integer operands divide as floats, as torch's true division does.
    return f"({a[0]}.to(tl.float32) / {a[1]})" if _is_integral(node.args[0]) and _is_integral(node.args[1]) else f"({a[0]} / {a[1]})"


def _pow(a: list[str], node: Node) -> str | None:
    exponent = node.args[1]
    if not isinstance(exponent, (int, float)) or isinstance(exponent, bool):
        return None
    if exponent == 0.5:
        return f"tl.sqrt({a[0]})"
    if exponent == -0.5:
        return f"tl.rsqrt({a[0]})"
    if float(exponent).is_integer() and 1 <= abs(exponent) <= 4:
        product = " * ".join([a[0]] * int(abs(exponent)))
        return f"({product})" if exponent > 0 else f"(1.0 / ({product}))"
    # Other exponents: negative bases give NaN, as torch's pow does for a fractional exponent.
    return f"tl.exp2({literal(float(exponent))} * tl.log2({a[0]}))"


def _where(a: list[str], node: Node) -> str | None:
    return f"tl.where({a[0]}, {a[1]}, {a[2]})"


def _tanh(a: list[str], node: Node) -> str | None:
    # The prelude's _tanh (kernels.py): 2*sigmoid(2x) - 1 loses every digit near 0, and
    # libdevice's tanh does not run in Triton's interpreter.
    return f"_tanh({a[0]})"


# torch's maximum, minimum, relu and clamp return NaN for a NaN input; Triton's tl.maximum and
# tl.minimum drop it unless asked (an AMP overflow would become a number).
NAN_RULE = "propagate_nan=tl.PropagateNan.ALL"
_NAN = NAN_RULE


def _relu(a: list[str], node: Node) -> str | None:
    return f"tl.maximum({a[0]}, 0, {_NAN})"


def _clamp(a: list[str], node: Node) -> str | None:
    low, high = (list(node.args[1:]) + [None, None])[:2]
    low = node.kwargs.get("min", low)
    high = node.kwargs.get("max", high)
    if isinstance(low, Node) or isinstance(high, Node):
        return None
    text = a[0]
    if low is not None:
        text = f"tl.maximum({text}, {literal(low)}, {_NAN})"
    if high is not None:
        text = f"tl.minimum({text}, {literal(high)}, {_NAN})"
    return text


def _cast(a: list[str], node: Node) -> str | None:
    # The value is cast to the node's dtype after every op (see kernels.py), so the op is its input.
    if node.target is aten._to_copy.default and set(node.kwargs) - {"dtype", "layout", "device"}:
        return None
    value = node.meta.get("val")
    source = node.args[0].meta.get("val") if isinstance(node.args[0], Node) else None
    if value is None or source is None or value.device != source.device:
        return None
    return a[0]


def _not(a: list[str], node: Node) -> str | None:
    value = node.args[0].meta.get("val") if isinstance(node.args[0], Node) else None
    return f"({a[0]} == 0)" if value is not None and value.dtype == torch.bool else None


def _is_integral(arg: Any) -> bool:
    if isinstance(arg, Node):
        value = arg.meta.get("val")
        return isinstance(value, torch.Tensor) and not value.dtype.is_floating_point
    return isinstance(arg, int)


_POINTWISE: dict[Any, tuple[str, Emit]] = {
    aten.add.Tensor: ("arithmetic", _add),
    aten.add.Scalar: ("arithmetic", _add),
    aten.sub.Tensor: ("arithmetic", _sub),
    aten.sub.Scalar: ("arithmetic", _sub),
    aten.mul.Tensor: ("arithmetic", _binary("*")),
    aten.mul.Scalar: ("arithmetic", _binary("*")),
    aten.div.Tensor: ("arithmetic", _div),
    aten.div.Scalar: ("arithmetic", _div),
    aten.neg.default: ("arithmetic", lambda a, n: f"(-{a[0]})"),
    aten.reciprocal.default: ("arithmetic", lambda a, n: f"(1.0 / {a[0]})"),
    aten.pow.Tensor_Scalar: ("arithmetic", _pow),
    aten.maximum.default: ("arithmetic", lambda a, n: f"tl.maximum({a[0]}, {a[1]}, {_NAN})"),
    aten.minimum.default: ("arithmetic", lambda a, n: f"tl.minimum({a[0]}, {a[1]}, {_NAN})"),
    aten.abs.default: ("arithmetic", _call("tl.abs")),
    aten.relu.default: ("arithmetic", _relu),
    aten.clamp.default: ("arithmetic", _clamp),
    aten.exp.default: ("transcendental", _call("tl.exp")),
    aten.log.default: ("transcendental", _call("tl.log")),
    aten.sqrt.default: ("transcendental", _call("tl.sqrt")),
    aten.rsqrt.default: ("transcendental", _call("tl.rsqrt")),
    aten.sin.default: ("transcendental", _call("tl.sin")),
    aten.cos.default: ("transcendental", _call("tl.cos")),
    aten.sigmoid.default: ("transcendental", _call("tl.sigmoid")),
    aten.tanh.default: ("transcendental", _tanh),
    aten.erf.default: ("transcendental", _call("tl.math.erf")),
    aten.eq.Tensor: ("comparison", _binary("==")),
    aten.eq.Scalar: ("comparison", _binary("==")),
    aten.ne.Tensor: ("comparison", _binary("!=")),
    aten.ne.Scalar: ("comparison", _binary("!=")),
    aten.lt.Tensor: ("comparison", _binary("<")),
    aten.lt.Scalar: ("comparison", _binary("<")),
    aten.le.Tensor: ("comparison", _binary("<=")),
    aten.le.Scalar: ("comparison", _binary("<=")),
    aten.gt.Tensor: ("comparison", _binary(">")),
    aten.gt.Scalar: ("comparison", _binary(">")),
    aten.ge.Tensor: ("comparison", _binary(">=")),
    aten.ge.Scalar: ("comparison", _binary(">=")),
    aten.where.self: ("comparison", _where),
    aten.logical_not.default: ("comparison", _not),
    aten.bitwise_not.default: ("comparison", _not),
    aten._to_copy.default: ("cast", _cast),
    prims.convert_element_type.default: ("cast", _cast),
}

# Reductions over the last dimension: op -> how the kernel combines a row.
REDUCTIONS: dict[Any, str] = {
    aten.sum.dim_IntList: "sum",
    aten.amax.default: "max",
    aten.amin.default: "min",
    aten.mean.dim: "mean",
    aten.var_mean.correction: "var_mean",
}

FAMILIES = ("arithmetic", "transcendental", "comparison", "cast", "reduction")

_KERNEL_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool}


def _tensor_val(node: Any) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _dtypes_supported(node: Node) -> bool:
    values = [node.meta.get("val")] if node.target is not aten.var_mean.correction else list(node.meta.get("val") or ())
    values += [_tensor_val(arg) for arg in node.args if isinstance(arg, Node)]
    return all(isinstance(v, torch.Tensor) and v.dtype in _KERNEL_DTYPES and v.device.type != "meta" for v in values)


def reduction_dims_are_last(node: Node) -> bool:
    """Whether a reduction node reduces exactly the last dimension of its input."""
    source = _tensor_val(node.args[0])
    if source is None or source.dim() == 0:
        return False
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None or len(dims) != 1:
        return False
    if node.target is aten.sum.dim_IntList and node.kwargs.get("dtype") is not None:
        return False
    return dims[0] in (-1, source.dim() - 1)


def family_of(node: Node) -> str | None:
    """The op family a node fuses under, or None when it may not join a region."""
    if node.op != "call_function" or not _dtypes_supported(node):
        return None
    if node.target in REDUCTIONS:
        source = _tensor_val(node.args[0])
        # max/min pad with -inf/inf, which only a floating-point row can hold exactly.
        if REDUCTIONS[node.target] in ("max", "min") and not (source is not None and source.dtype.is_floating_point):
            return None
        return "reduction" if reduction_dims_are_last(node) else None
    entry = _POINTWISE.get(node.target)
    if entry is None:
        return None
    family, emit = entry
    if any(isinstance(arg, Node) and _tensor_val(arg) is None for arg in node.args):
        return None
    if any(isinstance(v, Node) for v in node.kwargs.values()):
        return None
    placeholder = ["x"] * len(node.args)
    return family if emit(placeholder, node) is not None else None


def literal(value: Any) -> str:
    """A Python scalar as Triton source text."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if math.isnan(value):
            return 'float("nan")'
        if math.isinf(value):
            return 'float("inf")' if value > 0 else 'float("-inf")'
        return repr(value)
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"unsupported scalar {value!r}")


def triton_expression(node: Node, args: list[str]) -> str:
    """The Triton expression for a pointwise node, given its arguments as source text."""
    _, emit = _POINTWISE[node.target]
    text = emit(args, node)
    assert text is not None, f"{node.target} passed family_of but has no Triton text"
    return text
