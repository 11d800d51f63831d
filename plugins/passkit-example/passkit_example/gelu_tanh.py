"""Own the ``example:gelu_tanh`` pattern set: exact GELU -> its tanh approximation.

The search and the replacement are ordinary torch functions; ``from_trace`` turns the search
into a pattern by tracing it, through the same decomposition table as the program, so the
pattern matches whatever the pipeline's earlier steps made of ``F.gelu``. The replacement is
traced on the matched values and inlined.

This rewrite changes numerics on purpose (the tanh form differs from the exact GELU by up to
about 5e-4 in absolute value): use it where a model was trained with, or tolerates, the
approximation. That is why it is a plugin's choice in a pipeline file, not a built-in default.
The set declares that difference as its ``tolerance``, so ``passkit run``, ``verify`` and
``passkit bisect`` of a pipeline that applies it accept it (``TOLERANCE``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from passkit.patterns import PatternSet, Where, from_trace

__all__ = ["gelu_tanh_set"]

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# (rtol, atol): the tanh form is within about 5e-4 of the exact GELU and its derivative within
# 8.7e-4 of the exact one; a weight's gradient sums that over the batch, and on the shipped block
# the gradients move by up to 3.3e-3, so the atol leaves room above that (docs/writing-passes.md).
TOLERANCE = (1e-3, 5e-3)


def exact_gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU computed with erf."""
    return F.gelu(x)


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def gelu_tanh_set() -> PatternSet:
    # Traced at rank 2, it matches any rank: a Linear's rank-3 output too.
    pattern = from_trace(
        exact_gelu, [torch.empty(3, 5)], tanh_gelu, name="gelu_tanh", where={"x": Where(dtype=FLOATS)}
    )
    return PatternSet("example:gelu_tanh", (pattern,), "exact GELU -> tanh-approximated GELU", tolerance=TOLERANCE)
