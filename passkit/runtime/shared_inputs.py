"""Own the check that inputs a compiled program mutates share no memory with other inputs.

Functionalization treats every input as its own memory. When two distinct tensors passed in
are views of one base (AOT Autograd's "synthetic base" case) and the program writes to one,
eager's other view sees the write and the compiled program's does not: a silent wrong value.
Dynamo's graphs merge such views where they can (``frontends/synthetic_base``); calls where
views that remain overlap are refused with one line; the check runs on every call because the compiled
program is reused for any inputs of the same shapes. Whether two live tensors overlap depends
only on where their bytes start and their sizes and strides, so a program with static shapes
remembers the start addresses it last found clean and skips the check while they stay the same
(every step of a training loop: the same parameters, buffers and, often, input buffers).
"""

from __future__ import annotations

from typing import Sequence

import torch

from passkit.errors import PasskitError

__all__ = ["SHARED_STORAGE_ERROR", "SharedStorageCheck", "refuse_mutated_shared_storage"]

SHARED_STORAGE_ERROR = (
    "passkit: inputs {mutated} and {other} share memory (views of one tensor) and the program "
    "writes to input {mutated}; pass the base tensor once, or clone the views before the call"
)


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``t`` can reach, from its first element to one past its last."""
    start = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
    if t.numel() == 0:
        return start, start
    extent = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
    return start, start + (extent + 1) * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1


def refuse_mutated_shared_storage(mutated: Sequence[int], args: Sequence[object]) -> None:
    """Raise when an input the program mutates overlaps another input tensor in memory."""
    # One pass groups the inputs by storage; only inputs that share one are compared. Comparing
    # every mutated input with every input cost a ResNet with 24 running statistics 1,224
    # comparisons on every call.
    by_storage: dict[int, list[int]] = {}
    for i, arg in enumerate(args):
        if isinstance(arg, torch.Tensor) and arg.layout == torch.strided:
            by_storage.setdefault(arg.untyped_storage().data_ptr(), []).append(i)
    for m in mutated:
        arg = args[m]
        if not isinstance(arg, torch.Tensor) or arg.layout != torch.strided:
            continue
        for i in by_storage[arg.untyped_storage().data_ptr()]:
            if i != m and _overlap(arg, args[i]):  # type: ignore[arg-type]
                raise PasskitError(SHARED_STORAGE_ERROR.format(mutated=m, other=i))


class SharedStorageCheck:
    """``refuse_mutated_shared_storage`` for one program, skipped while the inputs start where
    they did at the last clean call (static shapes only: with symbolic sizes the same starts
    can cover other bytes)."""

    def __init__(self, mutated: Sequence[int], *, static_shapes: bool) -> None:
        self.mutated = list(mutated)
        self.static_shapes = static_shapes
        self._clean: list[int] | None = None

    def __call__(self, args: Sequence[object]) -> None:
        try:
            starts = [arg.data_ptr() for arg in args]  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):  # a non-tensor input, or a layout without one
            starts = None
        if starts is not None and starts == self._clean:
            return
        refuse_mutated_shared_storage(self.mutated, args)
        if self.static_shapes:
            self._clean = starts
