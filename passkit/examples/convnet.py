"""Own the example convolutional model: convolution, BatchNorm (running statistics), a head.

BatchNorm mutates its buffers in training, so this model exercises input-mutation write-back
and, under Inductor, channels-last layouts for the saved activations.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ConvBN", "conv_bn"]


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x)).relu()
        return self.head(y.mean(dim=(2, 3)))


def conv_bn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The conv/BatchNorm net with a batch of 16 32x32 RGB images."""
    torch.manual_seed(0)
    return ConvBN(), (torch.randn(16, 3, 32, 32),)
