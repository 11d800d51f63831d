"""Own the example models: a causal self-attention transformer block and an MLP.

Each factory returns ``(module, example_inputs)``, the shape ``passkit run --model`` expects.
Attention is written out explicitly (no fused SDPA) so every stage has real work to show.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["Block", "TransformerStack", "MLP", "block", "small_stack", "large_stack", "mlp"]


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=-1)
        shape = (batch, seq, self.heads, dim // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(dim // self.heads)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        attended = scores.softmax(dim=-1) @ v
        return self.proj(attended.transpose(1, 2).reshape(batch, seq, dim))


class Block(nn.Module):
    """Pre-norm transformer block: attention and a GELU MLP, each with a residual."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TransformerStack(nn.Module):
    def __init__(self, layers: int = 2, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


class MLP(nn.Module):
    def __init__(self, dim: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.LayerNorm(hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def block() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """One transformer block at d=64, input (4, 32, 64): what ``passkit run`` uses by default."""
    torch.manual_seed(0)
    return Block(64, 4), (torch.randn(4, 32, 64),)


def small_stack() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return TransformerStack(2, 64, 4), (torch.randn(4, 32, 64),)


def large_stack() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return TransformerStack(2, 256, 8), (torch.randn(8, 128, 256),)


def mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return MLP(64, 256), (torch.randn(32, 64),)
