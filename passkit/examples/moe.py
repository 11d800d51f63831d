"""A mixture-of-experts block with top-1 token routing, the data-dependent program passkit's
MoE benchmark times and its tests train.

``torch.nonzero(idx == i)`` picks each expert's rows, so every expert's row count is an unbacked
size (compile it under ``torch._dynamo.config.capture_dynamic_output_shape_ops = True``);
``index_add`` puts each expert's output back, weighted by the gate.
"""

from __future__ import annotations

import torch

__all__ = ["MoE"]


class MoE(torch.nn.Module):
    """Top-1 token routing: a gate picks each token's expert; each expert is a GELU MLP."""

    def __init__(self, dim: int = 16, experts: int = 4) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(dim, experts)
        self.experts = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))
            for _ in range(experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, idx = self.gate(x).softmax(-1).max(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            rows = torch.nonzero(idx == i).squeeze(-1)
            out = out.index_add(0, rows, expert(x[rows]) * weight[rows, None])
        return out
