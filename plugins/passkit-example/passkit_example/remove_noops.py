"""Own ``example.remove_noops``: drop ops that provably return their input unchanged.

An op is removed only when its result equals its input bit for bit, with the same shape, dtype,
strides and device (read from the ``val`` metadata that tracing attaches), so that no later op
can tell the difference, in inference and in training graphs alike:

- ``aten.view``, ``aten._unsafe_view``, ``aten.reshape``, ``aten.expand`` to the input's own
  shape, and ``aten.alias``: in a functional graph nothing mutates, so an alias with identical
  metadata is the input;
- ``aten.mul(x, 1)`` and ``aten.div(x, 1)`` with a Python scalar;
- ``aten.sub(x, 0)``; and ``aten.add(x, 0)`` only for integer and bool tensors, because for
  floating point ``-0.0 + 0`` is ``+0.0`` (``add(x, -0.0)`` is exact and is removed).

What stays, on purpose:

- a node the graph returns: eager gives the caller a fresh tensor (or a view with its own
  metadata), and returning the input itself instead would make an output alias an input or
  another output;
- complex tensors in arithmetic: ``(a + bj) * 1`` computes ``b * 0`` and so turns an infinite
  imaginary part into NaN;
- ``aten.detach``: before the ``joint`` step it stops gradients, so removing it changes them;
- ``aten.clone``: it has a ``memory_format`` and exists to give a fresh buffer; left to DCE-like
  passes that can reason about its users.
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Callable

import pydantic
import torch
from torch.fx import GraphModule, Node

from passkit import graph_pass
from passkit.program import Program

__all__ = ["REMOVABLE_OPS", "RemoveNoopsOptions", "remove_noops"]

aten = torch.ops.aten


def _metadata_suffices(node: Node, source: Node) -> bool:
    # A same-shape, same-strides alias is its input: the metadata check is the whole proof.
    return True


def _is_real_scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value))


def _times_one(node: Node, source: Node) -> bool:
    other = node.args[1]
    return _is_real_scalar(other) and other == 1


def _minus_zero(node: Node, source: Node) -> bool:
    other = node.args[1]
    if not _is_real_scalar(other) or other != 0:
        return False
    # x - (+0) is exact for every float, -0.0 included; x - (-0.0) turns -0.0 into +0.0.
    return not _is_floating(source) or math.copysign(1.0, other) > 0


def _plus_zero(node: Node, source: Node) -> bool:
    other = node.args[1]
    if not _is_real_scalar(other) or other != 0:
        return False
    # x + (-0.0) is exact for every float; x + (+0) turns -0.0 into +0.0.
    return not _is_floating(source) or math.copysign(1.0, other) < 0


def _is_floating(node: Node) -> bool:
    return node.meta["val"].dtype.is_floating_point


Check = Callable[[Node, Node], bool]

# Option name -> (the exact overloads it covers, whether it is arithmetic, the identity check).
REMOVABLE_OPS: dict[str, tuple[tuple[Any, ...], bool, Check]] = {
    "aten.view": ((aten.view.default,), False, _metadata_suffices),
    "aten._unsafe_view": ((aten._unsafe_view.default,), False, _metadata_suffices),
    "aten.reshape": ((aten.reshape.default,), False, _metadata_suffices),
    "aten.expand": ((aten.expand.default,), False, _metadata_suffices),
    "aten.alias": ((aten.alias.default,), False, _metadata_suffices),
    "aten.mul": ((aten.mul.Tensor, aten.mul.Scalar), True, _times_one),
    # div.Tensor_mode and div.Scalar_mode round (floor(x / 1) != x), so they are not listed.
    "aten.div": ((aten.div.Tensor, aten.div.Scalar), True, _times_one),
    "aten.sub": ((aten.sub.Tensor, aten.sub.Scalar), True, _minus_zero),
    "aten.add": ((aten.add.Tensor, aten.add.Scalar), True, _plus_zero),
}


class RemoveNoopsOptions(pydantic.BaseModel):
    """Options of ``example.remove_noops``, validated when the pipeline file loads."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    ops: list[str] = pydantic.Field(default_factory=lambda: list(REMOVABLE_OPS))
    max_rewrites: int | None = pydantic.Field(default=None, ge=0)

    @pydantic.field_validator("ops")
    @classmethod
    def _known_ops(cls, ops: list[str]) -> list[str]:
        for op in ops:
            if op not in REMOVABLE_OPS:
                close = difflib.get_close_matches(op, list(REMOVABLE_OPS), n=1, cutoff=0.85)
                hint = f"; did you mean {close[0]!r}?" if close else f"; choose from {', '.join(REMOVABLE_OPS)}"
                raise ValueError(f"unknown op {op!r}{hint}")
        return ops


def _tensor_meta(node: Any) -> torch.Tensor | None:
    if not isinstance(node, Node):
        return None
    value = node.meta.get("val")
    return value if isinstance(value, torch.Tensor) else None


def _provably_noop(node: Node, arithmetic: bool, check: Check) -> bool:
    if not node.args or any(user.op == "output" for user in node.users):
        return False
    source = node.args[0]
    out, inp = _tensor_meta(node), _tensor_meta(source)
    if out is None or inp is None:
        return False  # no metadata, no proof
    if arithmetic and (len(node.args) != 2 or node.kwargs or out.dtype.is_complex):
        return False
    same = (
        tuple(out.shape) == tuple(inp.shape)
        and out.stride() == inp.stride()
        and out.dtype == inp.dtype
        and out.device == inp.device
    )
    return same and check(node, source)


def _rewrite_graph(gm: GraphModule, by_target: dict[Any, tuple[bool, Check]], budget: int | None) -> int:
    rewrites = 0
    for node in list(gm.graph.nodes):
        if budget is not None and rewrites >= budget:
            break
        if node.op != "call_function" or node.target not in by_target:
            continue
        arithmetic, check = by_target[node.target]
        if not _provably_noop(node, arithmetic, check):
            continue
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
        rewrites += 1
    if rewrites:
        gm.recompile()
    return rewrites


@graph_pass("example.remove_noops", requires={"functional"}, options=RemoveNoopsOptions)
def remove_noops(program: Program, *, ops: list[str], max_rewrites: int | None) -> bool:
    """Remove ops that return their input unchanged: same-shape views, x*1, x/1, x-0, int x+0.

    ``ops`` chooses which kinds to remove; ``max_rewrites`` caps the rewrites over all graphs
    (useful to bisect a suspected miscompile down to one rewrite). The report's ``rewrites``
    figure says how many were made.
    """
    by_target: dict[Any, tuple[bool, Check]] = {}
    for name in ops:
        overloads, arithmetic, check = REMOVABLE_OPS[name]
        for overload in overloads:
            by_target[overload] = (arithmetic, check)
    total = 0
    for gm in program.graphs.values():
        budget = None if max_rewrites is None else max_rewrites - total
        total += _rewrite_graph(gm, by_target, budget)
    program.record_stat("rewrites", total)
    return total > 0
