"""Own the check at the door of compiled code: every tensor a compiled program is called with
is real, plain, and on the device it was compiled for.

Compiled kernels (Inductor's C++ and Triton, a plugin's) read data pointers without asking the
dispatcher, so a fake or meta tensor, a tensor subclass or a tensor on another device would
crash the process or read garbage. Such a value is refused in one line that names the input
and the step whose code it was about to enter. The common call pays one type test and one
device comparison per tensor input.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from passkit import _torch
from passkit.errors import PasskitError

__all__ = ["EntryCheck", "EntryError"]


class EntryError(PasskitError):
    """A value that compiled code cannot take reached it."""


class EntryCheck:
    """Refuse values compiled code cannot read, before any kernel runs.

    ``names`` are the program's input names (for messages), ``examples`` its example inputs
    (their devices are the devices the code was compiled for), ``step`` where the code came
    from (``training.toml: steps[8] (codegen.inductor)``).
    """

    def __init__(self, names: Sequence[str], examples: Sequence[Any], step: str) -> None:
        self.names = list(names)
        self.step = step
        self.devices = [
            (i, example.device) for i, example in enumerate(examples) if isinstance(example, torch.Tensor)
        ]

    def __call__(self, args: Sequence[Any]) -> None:
        plain = _torch.PLAIN_TENSOR_TYPES
        for i, device in self.devices:
            value = args[i]
            if type(value) not in plain or value.device != device:
                self._refuse_or_pass(i, value, device)

    def _refuse_or_pass(self, i: int, value: Any, device: torch.device) -> None:
        kind = _torch.unreadable_kind(value)
        if kind is not None:
            problem = f"{kind}, which compiled code cannot read; {_remedy(value)}"
        elif isinstance(value, torch.Tensor) and value.device != device:
            problem = f"on {value.device}, but the code was compiled for {device}; move it there, or compile for {value.device}"
        else:
            return  # a real tensor of a plain Python subclass, on the right device
        raise EntryError(f"{self.step}: input {i} ({self.names[i]}) is {problem}")


def _remedy(value: Any) -> str:
    if _torch.is_traced_value(value):
        return "call the compiled program on real tensors, outside any trace"
    if isinstance(value, torch.Tensor) and value.is_meta:
        return "call it on tensors with data"
    return "compile the program with this kind of input, so that passkit flattens it"
