"""Own the stand-ins ``joint`` differentiates for ops whose eager gradient functionalization loses.

``rrelu`` in training draws its slopes into a ``noise`` tensor that it writes in place, and its
gradient reads ``noise``. Traced under functionalization, the backward reads the buffer as it
was before the write (uninitialised memory: a silent wrong gradient), and torch's own
``rrelu_with_noise_functional`` formula makes the same mistake. The stand-in draws the slopes
with the same kernel, under the same seed, and multiplies: ``x * noise`` is eager's output bit
for bit and its gradient ``noise`` is eager's ``rrelu_with_noise_backward`` in training mode.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["DIFFERENTIABLE_FORMS"]

aten = torch.ops.aten

# rrelu_with_noise_backward treats a range narrower than this as a fixed leaky slope.
_RRELU_RANGE_EPS = 1e-6


def _rrelu_noise(x: torch.Tensor, lower: float, upper: float) -> torch.Tensor:
    with torch.no_grad():
        return aten.rrelu_with_noise_functional.default(x.detach(), torch.empty_like(x), lower, upper, True)[1]


def _rrelu(
    x: torch.Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False, generator: Any = None
) -> torch.Tensor:
    if not training or upper - lower <= _RRELU_RANGE_EPS or generator is not None:
        return aten.rrelu.default(x, lower, upper, training, generator)
    return x * _rrelu_noise(x, lower, upper)


def _rrelu_with_noise_functional(
    x: torch.Tensor, noise: torch.Tensor, lower: float = 1.0 / 8, upper: float = 1.0 / 3, training: bool = False,
    generator: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if not training or upper - lower <= _RRELU_RANGE_EPS or generator is not None:
        return aten.rrelu_with_noise_functional.default(x, noise, lower, upper, training, generator)
    drawn = _rrelu_noise(x, lower, upper)
    return x * drawn, drawn


DIFFERENTIABLE_FORMS: dict[Any, Any] = {
    aten.rrelu.default: _rrelu,
    aten.rrelu_with_noise_functional.default: _rrelu_with_noise_functional,
}
