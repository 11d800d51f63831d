"""Own the line that opens each graph's compile: which graph, and for a recompile, what changed.

Dynamo hands the backend a graph per frame (code location) it compiles, and hands the same
frame again when a guard fails: new shapes under ``dynamic=False``, symbolic sizes after the
first change under ``dynamic=None``, another dtype, ``requires_grad`` or grad mode. Before
capture starts (capture itself takes seconds on a large model), the backend sends one
``compiling`` or ``recompiling`` event (``passkit.core.progress``)::

    compiling graph 1: M.forward at model.py:12 (Dynamo frame 0/0), inputs x float32[2, 8]
    recompiling graph 2: M.forward at model.py:12 (Dynamo frame 0/1): x float32[2, 8] -> float32[3, 8]

A recompile compares the inputs with the previous compile of the same frame; when none of
shapes, dtypes, requires-grad or grad mode changed, the line says so (another guard failed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.fx import GraphModule

from passkit import _torch
from passkit.core.progress import ProgressEvent

__all__ = ["GraphInputs", "InputLook", "CompileAnnouncer", "look_at", "changes"]

SHOWN_INPUTS = 3  # inputs (or changes) a line names before "(+N more)"


@dataclass(frozen=True)
class InputLook:
    """What a recompile may hinge on for one input: dtype, shape, requires-grad."""

    name: str
    is_tensor: bool
    dtype: str = ""
    shape: tuple[str, ...] = ()
    requires_grad: bool = False
    is_parameter: bool = False

    def describe(self) -> str:
        """``float32[2, 8]``, ``int`` for a non-tensor; ``(requires grad)`` is said where it changed."""
        if not self.is_tensor:
            return self.dtype
        return f"{self.dtype}[{', '.join(self.shape)}]"


@dataclass(frozen=True)
class GraphInputs:
    """The inputs of one graph Dynamo handed over, and the grad mode it was traced under."""

    inputs: tuple[InputLook, ...]
    grad_mode: bool


def look_at(gm: GraphModule, example_inputs: Sequence[Any]) -> GraphInputs:
    """The inputs of Dynamo's ``gm`` as a recompile line compares them."""
    names = _torch.dynamo_input_names(gm)
    looks = []
    for (name, state), value in zip(names, example_inputs):
        if isinstance(value, torch.Tensor):
            looks.append(InputLook(
                name=name, is_tensor=True, dtype=str(value.dtype).removeprefix("torch."),
                shape=tuple(str(size) for size in value.shape), requires_grad=bool(value.requires_grad),
                is_parameter=state or isinstance(value, torch.nn.Parameter),
            ))
        else:
            looks.append(InputLook(name=name, is_tensor=False, dtype=type(value).__name__))
    return GraphInputs(inputs=tuple(looks), grad_mode=torch.is_grad_enabled())


def changes(before: GraphInputs, after: GraphInputs) -> list[str]:
    """What differs from ``before`` to ``after``, one phrase each, grad mode first."""
    found = []
    if before.grad_mode != after.grad_mode:
        found.append(f"grad mode {_on(before.grad_mode)} -> {_on(after.grad_mode)}")
    if len(before.inputs) != len(after.inputs):
        found.append(f"{len(before.inputs)} inputs -> {len(after.inputs)}")
    old = {look.name: look for look in before.inputs}
    for look in after.inputs:
        previous = old.get(look.name)
        if previous is None:
            if len(before.inputs) == len(after.inputs):
                found.append(f"new input {look.name} {look.describe()}")
            continue
        if previous.describe() != look.describe():
            found.append(f"{look.name} {previous.describe()} -> {look.describe()}")
        if previous.requires_grad != look.requires_grad:
            found.append(f"{look.name} requires grad {_yes(previous.requires_grad)} -> {_yes(look.requires_grad)}")
    return found


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _listed(items: list[str], joiner: str) -> str:
    more = f" (+{len(items) - SHOWN_INPUTS} more)" if len(items) > SHOWN_INPUTS else ""
    return joiner.join(items[:SHOWN_INPUTS]) + more


class CompileAnnouncer:
    """Remembers each Dynamo frame's last compile, to say what a recompile of it changed."""

    def __init__(self) -> None:
        self._last: dict[Any, GraphInputs] = {}

    def event(self, gm: GraphModule, example_inputs: Sequence[Any], graph_number: int) -> ProgressEvent:
        """The ``compiling`` or ``recompiling`` event for graph ``graph_number`` (1-based)."""
        seen = look_at(gm, example_inputs)
        frame = _torch.current_frame_id()
        compile_id = _torch.current_compile_id()
        graph = f"graph {graph_number}"
        where = _torch.dynamo_code_location()
        head = f"{graph}: {where}" if where else graph
        if compile_id:
            head += f" (Dynamo frame {compile_id})"
        previous = self._last.get(frame) if frame is not None else None
        if frame is not None:
            self._last[frame] = seen
        if previous is None:
            user = [f"{look.name} {look.describe()}" for look in seen.inputs if not look.is_parameter]
            inputs = f", inputs {_listed(user, ', ')}" if user else ""
            return ProgressEvent(kind="compiling", text=f"compiling {head}{inputs}", graph=graph)
        changed = changes(previous, seen)
        what = _listed(changed, "; ") if changed else "no input shape, dtype, requires-grad or grad mode changed"
        return ProgressEvent(kind="recompiling", text=f"recompiling {head}: {what}", graph=graph)
