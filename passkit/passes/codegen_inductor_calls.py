"""Own how a graph that ``codegen.inductor`` compiled is called.

Inductor's code takes its inputs boxed (a list it empties as it goes) and asserts their strides.
The callables here give the runtime wrapper a plain call: inference graphs run with grad off,
slots whose mutation the graph wrote itself come back as ``None``, and the backward copies a
gradient that autograd hands over in another layout to the traced one first. A freshly compiled
graph and one the compile cache loads again (``codegen_inductor_cache``) are wrapped alike, so
both import this module and neither imports the other.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

import pydantic
import torch

from passkit import _torch

__all__ = ["graph_ids", "device_type", "boxed", "no_grad_boxed", "backward_call", "with_source"]

graph_ids = itertools.count()  # Inductor's graph id of each forward/backward pair or inference graph


def with_written_slots(outputs: Any, written: Sequence[int]) -> Any:
    """The outputs with ``None`` back in each slot whose mutation the graph wrote itself (the
    runtime writes nothing back there)."""
    if not written:
        return outputs
    full = list(outputs)
    for k in written:  # ascending, so each slot lands where the graph's io has it
        full.insert(k, None)
    return full


def boxed(compiled: Callable[[list[Any]], Any], written: Sequence[int] = ()) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return with_written_slots(compiled(list(args)), written)

    return run


def no_grad_boxed(compiled: Callable[[list[Any]], Any], written: Sequence[int] = ()) -> Callable[..., Any]:
    """Inference graphs run with grad off, as in torch's AOT (``out=`` kernels reject grad)."""
    set_grad_enabled = _torch.set_grad_enabled

    def run(*args: Any) -> Any:
        enabled = torch.is_grad_enabled()
        set_grad_enabled(False)
        try:
            return with_written_slots(compiled(list(args)), written)
        finally:
            set_grad_enabled(enabled)

    return run


def backward_call(compiled: Callable[[list[Any]], Any], expected: Sequence[Any], check: Sequence[int],
                   donated: Sequence[int] = ()) -> Callable[..., Any]:
    """The backward's callable: inputs in ``check`` whose strides differ from the traced ones are
    copied first, and the ``donated`` inputs too when the backward keeps its graph (a later
    backward reads them again, and this one overwrites them).

    It also takes its inputs boxed (``run.passkit_boxed(list)``, a list it empties), so that the
    runtime can drop its own references and the saved tensors die as the backward goes.
    """
    layouts = [(k, traced_layout(expected[k])) for k in check]
    keeps_graph = _torch.backward_keeps_graph

    def boxed_run(boxed: list[Any]) -> Any:
        for k, layout in layouts:
            value = boxed[k]
            stride = layout if isinstance(layout, tuple) else dense_strides(value.size(), layout.order)
            if value.stride() != stride:
                boxed[k] = torch.empty_strided(value.size(), stride, dtype=value.dtype, device=value.device).copy_(value)
        if donated and keeps_graph():
            for k in donated:
                boxed[k] = boxed[k].clone()
        return compiled(boxed)

    def run(*args: Any) -> Any:
        return boxed_run(list(args))

    run.passkit_boxed = boxed_run  # type: ignore[attr-defined]
    return run


class DenseOrder(pydantic.BaseModel):
    """A symbolic program's traced layout: dense, dimensions from outermost to innermost."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    order: tuple[int, ...]


def traced_layout(value: torch.Tensor) -> tuple[int, ...] | DenseOrder:
    """The strides a tensor input must arrive with; in a symbolic program, whose strides are
    expressions of the sizes, the order of its dimensions, to lay out densely at each call."""
    strides = tuple(value.stride())
    if all(isinstance(s, int) for s in strides):
        return strides
    hints = [_torch.size_hint(s) for s in strides]
    return DenseOrder(order=tuple(sorted(range(len(hints)), key=lambda d: -hints[d])))


def dense_strides(size: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    strides = [0] * len(size)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(size[d], 1)
    return tuple(strides)


def with_source(fn: Callable[..., Any], source: str | None) -> Callable[..., Any]:
    """``fn`` showing the code Inductor generated, for dumps and traces (``passkit_source``)."""
    if source is not None:
        fn.passkit_source = source  # type: ignore[attr-defined]
    return fn


def device_type(values: Sequence[Any]) -> str | None:
    """The device type of the program's kernels: the first tensor input's (a GPU wins over CPU
    scalars that ride along)."""
    types = [v.device.type for v in values if isinstance(v, torch.Tensor)]
    return next((t for t in types if t != "cpu"), types[0] if types else None)
