"""Own the one tolerance rule: do a list of values agree with what eager (or capture) computed?

``verify = "numerics"``, ``passkit run``, ``passkit bisect``, ``passkit repro`` and the pytest
plugin all compare through ``compare_values``, with the tolerance ``tolerance_for`` gives. Structure counts as much as numbers: a missing value, a ``None`` where a
tensor was expected, a different count, shape or dtype is a mismatch, never "nothing to
compare". Floating tensors are compared with ``allclose`` (NaN equals NaN); other tensors and
non-tensor values must be equal.

The tolerance (``tolerance_for``) is the pipeline's ``[settings] rtol``/``atol``, loosened,
rtol and atol each on its own, to the loosest tolerance declared by a step that ran: a pass's
``tolerance`` (a pair, or a function of the step's options: ``rewrite`` declares the loosest of
the pattern sets it applies). An approximation by design is not a bug. Each pair is then held to
no more precision than its dtype carries (``dtype_tolerance``): torch.testing's defaults for
bfloat16 and float16, and half precision's for float32 computed on a GPU where TF32 matmuls or
convolutions are allowed. Whatever is looser wins. A value agrees when
``|actual - expected| <= atol + rtol * |expected|`` everywhere (``torch.allclose``).

Random ops follow one rule beside it (``same_random_draws``): each side of a comparison (eager
and the compiled program, the capture and a later stage) runs from the seed ``VERIFY_SEED``, so
dropout draws the same mask on both, and the caller's generators are restored afterwards.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

import torch

__all__ = [
    "RTOL", "ATOL", "DEFAULT_TOLERANCE", "VERIFY_SEED", "Comparison", "Mismatch", "Tolerance", "compare_values",
    "dtype_tolerance", "initialised_cuda", "loosest", "same_random_draws", "tolerance_for",
]

RTOL = 1e-4
ATOL = 1e-5


class Tolerance(NamedTuple):
    """``(rtol, atol)``; prints as verdict lines show it: ``rtol 0.001, atol 0.0001``."""

    rtol: float
    atol: float

    def __str__(self) -> str:
        return f"rtol {self.rtol:g}, atol {self.atol:g}"

    def to_json(self) -> dict[str, float]:
        return {"rtol": self.rtol, "atol": self.atol}


DEFAULT_TOLERANCE = Tolerance(RTOL, ATOL)

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
    """One difference: where (``label[index]``, or the whole ``label`` for a count), why, and
    the tolerance it was held to (the dtype's floor included)."""

    label: str
    index: int | str | None  # a position, or a name (``grad[fc.weight]``)
    why: str
    tolerance: Tolerance = DEFAULT_TOLERANCE

    @property
    def where(self) -> str:
        return self.label if self.index is None else f"{self.label}[{self.index}]"

    def __str__(self) -> str:
        return f"{self.where}: {self.why}"


@dataclass
class Comparison:
    """The largest absolute difference over paired tensors, each pair's, and every mismatch."""

    max_diff: float = 0.0
    mismatches: list[Mismatch] = field(default_factory=list)
    tolerance: Tolerance = DEFAULT_TOLERANCE
    diffs: list[float] = field(default_factory=list)  # max |diff| of each pair, in order

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {tuple(value.shape)} {value.dtype}"
    return "None" if value is None else type(value).__name__


def _pair(expected: Any, actual: Any, tolerance: Tolerance) -> tuple[float, str | None, Tolerance]:
    """(max |diff|, why they differ or None, the tolerance held to) for one pair of values."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
            return float("inf"), f"{_describe(expected)} vs {_describe(actual)}", tolerance
        return (0.0, None, tolerance) if expected == actual else (float("inf"), f"{expected!r} vs {actual!r}", tolerance)
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return float("inf"), f"{_describe(expected)} vs {_describe(actual)}", tolerance
    expected, actual = expected.detach(), actual.detach()
    if not (expected.is_floating_point() or expected.is_complex()):
        equal = bool(torch.equal(expected, actual))
        return (0.0 if equal else float("inf")), None if equal else "values differ", tolerance
    if expected.is_complex():
        expected, actual = torch.view_as_real(expected), torch.view_as_real(actual)
    held = Tolerance(*loosest((tolerance, dtype_tolerance(expected))))
    e, a = expected.double(), actual.double()
    both_nan = torch.isnan(e) & torch.isnan(a)
    gap = (e - a).abs().masked_fill(both_nan, 0.0)
    diff = float(gap.max()) if gap.numel() else 0.0
    if torch.allclose(a, e, rtol=held.rtol, atol=held.atol, equal_nan=True):
        return diff, None, held
    return diff, f"max |diff| {diff:.3g}", held


def compare_values(
    expected: Sequence[Any], actual: Sequence[Any], label: str, tolerance: tuple[float, float] = DEFAULT_TOLERANCE,
    *, names: Sequence[str] | None = None,
) -> Comparison:
    """Compare ``actual`` with ``expected`` value by value within ``tolerance`` (``tolerance_for``
    gives a pipeline's); mismatches name ``label[i]``, or ``label[name]`` given ``names``."""
    tolerance = Tolerance(float(tolerance[0]), float(tolerance[1]))
    result = Comparison(tolerance=tolerance)
    if len(expected) != len(actual):
        result.mismatches.append(Mismatch(label, None, f"{len(expected)} values expected, {len(actual)} found", tolerance))
        result.max_diff = float("inf")
    for i, (e, a) in enumerate(zip(expected, actual)):
        diff, why, held = _pair(e, a, tolerance)
        result.max_diff = max(result.max_diff, diff)
        result.diffs.append(diff)
        if why is not None:
            result.mismatches.append(Mismatch(label, names[i] if names is not None else i, why, held))
    return result


def loosest(tolerances: Iterable[tuple[float, float] | None]) -> tuple[float, float] | None:
    """The largest rtol and the largest atol of some ``(rtol, atol)`` pairs (None entries are
    ignored); None when none is given."""
    given = [t for t in tolerances if t is not None]
    if not given:
        return None
    return Tolerance(max(float(t[0]) for t in given), max(float(t[1]) for t in given))


def tolerance_for(settings: Any, steps: Iterable[Any] = ()) -> Tolerance:
    """The tolerance a pipeline's results are held to: the settings' ``rtol``/``atol`` (default
    ``RTOL``/``ATOL``), loosened to the loosest tolerance that ``steps`` (those that ran) declare.

    Each of ``steps`` is a pipeline step (its pass declares for its options:
    ``Pass.declared_tolerance``) or a bare pass (declaring for its default options)."""
    base = Tolerance(float(getattr(settings, "rtol", RTOL)), float(getattr(settings, "atol", ATOL)))
    declared = []
    for step in steps:
        pass_ = getattr(step, "pass_", step)
        declare = getattr(pass_, "declared_tolerance", None)
        declared.append(declare(getattr(step, "options", None)) if declare is not None else None)
    return Tolerance(*loosest([base, *declared]))


VERIFY_SEED = 0


@contextlib.contextmanager
def same_random_draws(seed: int = VERIFY_SEED) -> Iterator[None]:
    """The one rule for random ops: inside, the CPU generator and every initialised CUDA
    generator start from ``seed``, so each side of a comparison that runs inside its own block
    draws the same numbers (a dropout mask); all of them are restored on the way out, so a check
    never changes what the user's program draws next. ``torch.manual_seed`` would also queue a
    reseed of CUDA generators not yet initialised, changing the user's GPU draws for good."""
    cuda = initialised_cuda()
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(seed)
        for index in cuda:
            torch.cuda.default_generators[index].manual_seed(seed)
        yield


def initialised_cuda() -> list[int]:
    """The CUDA devices whose generators exist; forking others would initialise CUDA."""
    return list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
