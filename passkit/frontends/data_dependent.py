"""Own the one-line errors for programs whose data decides what passkit cannot trace.

passkit traces sizes and values that depend on tensor data (``nonzero``, ``masked_select``,
``.item()``) as unbacked symbols, as torch's AOT path does. Two things stay out of reach: an
op torch traces no symbolic result for (``linalg.lstsq``'s, ``aten.equal``'s), and a Python
decision on such a value (``if x.sum() > 0``), which one graph cannot hold. The user gets one
line naming the op or the expression instead of torch's traceback, and ``on_error = "eager"``
runs the program eagerly.
"""

from __future__ import annotations

from passkit import _torch
from passkit.errors import PasskitError

__all__ = ["DATA_DEPENDENT_ERROR", "DATA_DEPENDENT_GUARD_ERROR", "explain_data_dependent"]

DATA_DEPENDENT_ERROR = (
    "passkit: {op} gives an output whose shape or value depends on tensor data, and torch traces "
    "no symbolic result for it (on_error = \"eager\" runs such programs eagerly)"
)
DATA_DEPENDENT_GUARD_ERROR = (
    "passkit: the program decides on a value read from tensor data ({expr}); passkit traces "
    "data-dependent sizes, not Python decisions on them (on_error = \"eager\" runs such programs eagerly)"
)


def explain_data_dependent(exc: Exception) -> Exception:
    """``exc`` as a one-line ``PasskitError`` when data-dependent tracing caused it; else ``exc``."""
    expr = _torch.data_dependent_guard(exc)
    op = _torch.data_dependent_op(exc) if expr is None else None
    if expr is None and op is None:
        return exc
    text = DATA_DEPENDENT_GUARD_ERROR.format(expr=expr) if expr is not None else DATA_DEPENDENT_ERROR.format(op=op)
    error = PasskitError(text)
    error.__cause__ = exc
    return error
