"""Own the ``gemm`` pattern set: matrix products that share an input become one product and a split.

``a @ w1ᵀ``, ``a @ w2ᵀ`` (and a third) with the same ``a`` — Llama's q/k/v projections, its
gate and up projections — become ``a @ cat(w1, w2, ...)ᵀ`` split back into its parts; with
biases (``addmm``) the biases are concatenated too. One larger GEMM reads ``a`` once and runs
at a better shape. The split parts are views with the wide product's strides: the ``rewrite``
pass re-derives every later node's metadata on fake tensors and undoes the rewrite if a later
op cannot take that layout (a ``view`` that needs the old strides).

The shared input must be one node: run ``fx.cse`` before this set, so that each linear's own
``view`` of the same activation is merged first. Three-way groups have the higher benefit.
"""

from __future__ import annotations

from typing import Any

import torch

from passkit.patterns.model import Alt, Op, Pattern, PatternSet, Var, Where

__all__ = ["gemm_set"]

aten = torch.ops.aten
_FLOAT = Where(dtype=(torch.float32, torch.float64, torch.float16, torch.bfloat16), rank=2)


def _transposed(name: str) -> Alt:
    return Alt(Op(aten.permute.default, Var(name, _FLOAT), (1, 0)), Op(aten.t.default, Var(name, _FLOAT)))


def _mm(i: int) -> Op:
    return Op(aten.mm.default, Var("a", _FLOAT), _transposed(f"w{i}"))


def _addmm(i: int) -> Op:
    return Op(aten.addmm.default, Var(f"b{i}", Where(rank=1)), Var("a", _FLOAT), _transposed(f"w{i}"), 1, 1)


def _fused_mm(count: int) -> Any:
    def replace(a: torch.Tensor, **weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        parts = [weights[f"w{i}"] for i in range(count)]
        out = torch.mm(a, torch.cat(parts).permute(1, 0))
        return tuple(out.split_with_sizes([w.shape[0] for w in parts], dim=1))

    return replace


def _fused_addmm(count: int) -> Any:
    def replace(a: torch.Tensor, **tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        weights = [tensors[f"w{i}"] for i in range(count)]
        biases = [tensors[f"b{i}"] for i in range(count)]
        out = torch.addmm(torch.cat(biases), a, torch.cat(weights).permute(1, 0))
        return tuple(out.split_with_sizes([w.shape[0] for w in weights], dim=1))

    return replace


def _same_dtype(match: Any) -> bool:
    names = [k for k in match.bindings if k.startswith(("w", "b"))]
    dtypes = {match.val(k).dtype for k in names} | {match.val("a").dtype}
    weights = {k for k in names if k.startswith("w")}
    # Distinct weights only: the same weight twice is a CSE matter, not a wider GEMM.
    return len(dtypes) == 1 and len({id(match.bindings[k]) for k in weights}) == len(weights)


def gemm_set() -> PatternSet:
    patterns = []
    for count, benefit in ((3, 3), (2, 2)):
        patterns.append(
            Pattern(f"mm_x{count}", tuple(_mm(i) for i in range(count)), replace=_fused_mm(count),
                    benefit=benefit, check=_same_dtype)
        )
        patterns.append(
            Pattern(f"addmm_x{count}", tuple(_addmm(i) for i in range(count)), replace=_fused_addmm(count),
                    benefit=benefit, check=_same_dtype)
        )
    return PatternSet("gemm", tuple(patterns), "matrix products sharing an input -> one product and a split")
