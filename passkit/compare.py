"""Own the one numerics comparator: does a list of values equal what eager computed?

``verify = "numerics"``, ``passkit run`` and the pytest plugin all compare through
``compare_values``. Structure counts as much as numbers: a missing value, a ``None`` where a
tensor was expected, a different count, shape or dtype is a mismatch, never "nothing to
compare". Floating tensors are compared with ``allclose`` (NaN equals NaN); other tensors and
non-tensor values must be equal.

The tolerance is the pipeline's ``[settings] rtol``/``atol``, loosened by the declared
``tolerance`` of any pass that ran (``tolerance_for``): an approximation by design is not a bug.
Each pair is then held to no more precision than its dtype carries (``dtype_tolerance``):
torch.testing's defaults for bfloat16 and float16, and half precision's for float32 computed on
a GPU where TF32 matmuls or convolutions are allowed. Settings looser than that floor win.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

__all__ = ["RTOL", "ATOL", "Comparison", "Mismatch", "compare_values", "dtype_tolerance", "tolerance_for"]

RTOL = 1e-4
ATOL = 1e-5

# torch.testing.assert_close's defaults: the precision each dtype can hold.
_DTYPE_TOLERANCE = {
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float16: (1e-3, 1e-5),
}
# TF32 keeps float16's 10-bit mantissa; torch's own TF32 tests allow 5e-3.
_TF32_TOLERANCE = (5e-3, 1e-4)


def dtype_tolerance(value: torch.Tensor) -> tuple[float, float]:
    """The least ``(rtol, atol)`` a comparison of ``value``'s dtype and device can hold to
    (complex values are compared as their real and imaginary parts)."""
    floor = _DTYPE_TOLERANCE.get(value.dtype)
    if floor is not None:
        return floor
    if value.dtype == torch.float32 and value.device.type == "cuda" and _tf32_allowed():
        return _TF32_TOLERANCE
    return (0.0, 0.0)


def _tf32_allowed() -> bool:
    return bool(torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32)


@dataclass(frozen=True)
class Mismatch:
    """One difference: where (``label[index]``, or the whole ``label`` for a count) and why."""

    label: str
    index: int | None
    why: str

    @property
    def where(self) -> str:
        return self.label if self.index is None else f"{self.label}[{self.index}]"

    def __str__(self) -> str:
        return f"{self.where}: {self.why}"


@dataclass
class Comparison:
    """The largest absolute difference over paired tensors, and every mismatch."""

    max_diff: float = 0.0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)} {value.dtype}"
    return "None" if value is None else type(value).__name__


def _pair(expected: Any, actual: Any, rtol: float, atol: float) -> tuple[float, str | None]:
    """(max |diff|, why they differ or None) for one pair of values."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
            return float("inf"), f"{_describe(expected)} vs {_describe(actual)}"
        return (0.0, None) if expected == actual else (float("inf"), f"{expected!r} vs {actual!r}")
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return float("inf"), f"{_describe(expected)} vs {_describe(actual)}"
    expected, actual = expected.detach(), actual.detach()
    if not (expected.is_floating_point() or expected.is_complex()):
        equal = bool(torch.equal(expected, actual))
        return (0.0 if equal else float("inf")), None if equal else "values differ"
    if expected.is_complex():
        expected, actual = torch.view_as_real(expected), torch.view_as_real(actual)
    floor_rtol, floor_atol = dtype_tolerance(expected)
    rtol, atol = max(rtol, floor_rtol), max(atol, floor_atol)
    e, a = expected.double(), actual.double()
    both_nan = torch.isnan(e) & torch.isnan(a)
    gap = (e - a).abs().masked_fill(both_nan, 0.0)
    diff = float(gap.max()) if gap.numel() else 0.0
    if torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):
        return diff, None
    return diff, f"max |diff| {diff:.3g}"


def compare_values(
    expected: Sequence[Any], actual: Sequence[Any], label: str, *, rtol: float = RTOL, atol: float = ATOL
) -> Comparison:
    """Compare ``actual`` with ``expected`` value by value; mismatches name ``label[i]``."""
    result = Comparison()
    if len(expected) != len(actual):
        result.mismatches.append(Mismatch(label, None, f"{len(expected)} values expected, {len(actual)} found"))
        result.max_diff = float("inf")
    for i, (e, a) in enumerate(zip(expected, actual)):
        diff, why = _pair(e, a, rtol, atol)
        result.max_diff = max(result.max_diff, diff)
        if why is not None:
            result.mismatches.append(Mismatch(label, i, why))
    return result


def tolerance_for(settings: Any, passes: Iterable[Any] = ()) -> tuple[float, float]:
    """``(rtol, atol)``: the settings' values (default ``RTOL``/``ATOL``), loosened to each
    pass's declared ``tolerance`` where that is larger."""
    rtol = float(getattr(settings, "rtol", RTOL))
    atol = float(getattr(settings, "atol", ATOL))
    for pass_ in passes:
        declared = getattr(pass_, "tolerance", None)
        if declared is not None:
            rtol, atol = max(rtol, declared[0]), max(atol, declared[1])
    return rtol, atol
