"""Own the ``conv_bn`` pattern set: fold an inference BatchNorm into the convolution before it.

``batch_norm(conv(x, w, b), γ, β, μ, σ², ε)`` in eval mode is ``conv(x, w·s, (b − μ)·s + β)``
with ``s = γ / sqrt(σ² + ε)``, per output channel. The folded weight and bias are computed in
the graph from the same parameters and buffers (O(weights) work), and the BatchNorm's full pass
over the activations disappears. Only ``_native_batch_norm_legit_no_training`` matches, which is
what an ``eval()`` BatchNorm traces to: a training-mode BatchNorm normalizes by batch
statistics and cannot be folded. Results differ from eager only by rounding.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from passkit.patterns.model import ANY, Op, Pattern, PatternSet, Var, Where

__all__ = ["conv_bn_set"]

aten = torch.ops.aten


def _folded(x: Any, w: Any, b: Any, stride: Any, padding: Any, dilation: Any, output_padding: Any, groups: Any,
            gamma: Any, beta: Any, mean: Any, var: Any, eps: Any) -> Any:
    scale = torch.rsqrt(var + eps)
    if gamma is not None:
        scale = scale * gamma
    weight = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
    shift = -mean * scale
    if b is not None:
        shift = shift + b * scale
    if beta is not None:
        shift = shift + beta
    return aten.convolution.default(x, weight, shift, stride, padding, dilation, False, output_padding, groups)


def conv_bn_set() -> PatternSet:
    floating = Where(dtype=(torch.float32, torch.float64, torch.float16, torch.bfloat16))
    conv = Op(
        aten.convolution.default,
        Var("x"), Var("w", floating), Var("b"), Var("stride"), Var("padding"), Var("dilation"),
        False, Var("output_padding"), Var("groups"),
    )
    batch_norm = Op(
        aten._native_batch_norm_legit_no_training.default,
        conv, Var("gamma"), Var("beta"), Var("mean", floating), Var("var", floating), ANY, Var("eps"),
    )
    pattern = Pattern(
        "fold",
        Op(operator.getitem, batch_norm, 0),
        replace=_folded,
        description="eval BatchNorm after a convolution -> the convolution with folded weight and bias",
    )
    return PatternSet("conv_bn", (pattern,), "inference BatchNorm folded into the convolution before it")
