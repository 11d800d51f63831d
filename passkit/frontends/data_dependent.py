"""Own the one-line error for programs whose shapes depend on tensor data.

passkit compiles static shapes. An op whose output size or a Python value depends on the data
(``masked_select``, ``nonzero``, ``x.item()``) cannot be traced with fake tensors; the user gets
one line naming the op instead of torch's traceback, and ``on_error = "eager"`` runs eagerly.
"""

from __future__ import annotations

from passkit import _torch
from passkit.errors import PasskitError

__all__ = ["DATA_DEPENDENT_ERROR", "explain_data_dependent"]

DATA_DEPENDENT_ERROR = (
    "passkit: {op} gives an output whose shape or value depends on tensor data; passkit compiles "
    "static shapes only (on_error = \"eager\" runs such programs eagerly)"
)


def explain_data_dependent(exc: Exception) -> Exception:
    """``exc`` as a one-line ``PasskitError`` when a data-dependent op caused it; else ``exc``."""
    op = _torch.data_dependent_op(exc)
    if op is None:
        return exc
    error = PasskitError(DATA_DEPENDENT_ERROR.format(op=op))
    error.__cause__ = exc
    return error
