"""Own the torch side of tensor subclasses: their layout, and flattening them into inner tensors.

A traceable wrapper subclass (``__tensor_flatten__``/``__tensor_unflatten__``: ``TwoTensor``,
``DTensor``, the jagged ``NestedTensor``) is a wrapper around plain inner tensors. A ``Layout``
records one subclass value's structure (its class, the context ``__tensor_flatten__`` returned,
outer size and stride, and each inner attribute, recursively), so that the value can be taken
apart into plain tensors and built again, as ``_functorch/_aot_autograd/subclass_utils.py`` does.
``trace_flat`` traces a function of subclasses as a graph of the plain inner tensors.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch.fx import GraphModule
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

__all__ = ["Layout", "sizes_traced_when_used", "is_subclass", "is_traceable", "layout_of", "flatten_value", "leaves_like", "unflatten_value", "trace_flat"]


def is_subclass(value: Any) -> bool:
    """A tensor of a ``torch.Tensor`` subclass other than the plain tensor, parameter or fake."""
    if not isinstance(value, torch.Tensor):
        return False
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return type(value) not in (torch.Tensor, torch.nn.Parameter, FakeTensor, FunctionalTensor)


def is_traceable(value: Any) -> bool:
    """A subclass that ``__tensor_flatten__`` takes apart (and ``__tensor_unflatten__`` rebuilds)."""
    return is_traceable_wrapper_subclass(value)


@dataclass
class Layout:
    """How one subclass value is built from plain tensors.

    ``inner`` maps each attribute ``__tensor_flatten__`` names to ``None`` (a plain tensor) or to
    the attribute's own ``Layout``; ``leaves`` counts the plain tensors in all, in order. An
    attribute that is no tensor (``DTensor``'s device mesh) is kept as it is in ``constants``.
    """

    cls: type
    context: Any
    inner: dict[str, Layout | None]
    outer_size: tuple[Any, ...]
    outer_stride: tuple[Any, ...]
    requires_grad: bool
    constants: dict[str, Any] = field(default_factory=dict)

    @property
    def leaves(self) -> int:
        return sum(1 if sub is None else sub.leaves for sub in self.inner.values())

    def leaf_names(self, prefix: str) -> list[str]:
        names: list[str] = []
        for attr, sub in self.inner.items():
            names += [f"{prefix}.{attr}"] if sub is None else sub.leaf_names(f"{prefix}.{attr}")
        return names

    def describe(self) -> str:
        inner = ", ".join(attr if sub is None else f"{attr}={sub.describe()}" for attr, sub in self.inner.items())
        return f"{self.cls.__name__}({inner})"


def layout_of(value: torch.Tensor) -> Layout:
    """The layout of a traceable wrapper subclass value (raises ``TypeError`` for any other)."""
    if not is_traceable_wrapper_subclass(value):
        raise TypeError(type(value).__name__)
    attrs, context = value.__tensor_flatten__()  # type: ignore[attr-defined]
    inner: dict[str, Layout | None] = {}
    constants = {}
    for attr in attrs:
        part = getattr(value, attr)
        if not isinstance(part, torch.Tensor):
            constants[attr] = part
        else:
            inner[attr] = layout_of(part) if is_subclass(part) else None
    size, stride = tuple(value.size()), tuple(value.stride())
    return Layout(type(value), context, inner, size, stride, value.requires_grad, constants)


def flatten_value(value: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors inside a subclass value, in its layout's order."""
    attrs, _ = value.__tensor_flatten__()  # type: ignore[attr-defined]
    leaves: list[torch.Tensor] = []
    for attr in attrs:
        part = getattr(value, attr)
        if isinstance(part, torch.Tensor):
            leaves += flatten_value(part) if is_subclass(part) else [part]
    return leaves


def leaves_like(value: Any, layout: Layout) -> list[Any]:
    """The plain tensors of ``value`` in the places ``layout`` has them, None where ``value`` has
    none (a gradient may lack what the value had: a jagged tensor's cached sequence lengths)."""
    leaves: list[Any] = []
    for attr, sub in layout.inner.items():
        part = getattr(value, attr, None)
        if sub is None:
            leaves.append(part if isinstance(part, torch.Tensor) else None)
        elif is_subclass(part):
            leaves += leaves_like(part, sub)
        else:
            leaves += [None] * sub.leaves
    return leaves


def unflatten_value(
    layout: Layout, leaves: Iterator[Any], *, runtime: bool = False, shaped_like: Any = None,
    outer: tuple[Sequence[int], Sequence[int]] | None = None,
) -> Any:
    """Build a subclass value of ``layout`` from the next plain tensors of ``leaves``.

    While tracing, the recorded outer size and stride are passed (symbolic where Dynamo made
    them so), or those of ``shaped_like``: a value the traced function built itself, whose
    ragged size is a nested int of this trace, not the one recorded. At run time a recorded size
    that holds a symbol is not passed: the subclass derives it from its inner tensors (a jagged
    tensor's from its offsets), unless ``outer`` gives it: the size and stride of the plain input
    a subclass gradient is built for.
    """
    inner = {
        attr: next(leaves) if sub is None else unflatten_value(
            sub, leaves, runtime=runtime, shaped_like=None if shaped_like is None else getattr(shaped_like, attr))
        for attr, sub in layout.inner.items()
    }
    inner.update(layout.constants)
    size, stride = layout.outer_size, layout.outer_stride
    if shaped_like is not None:
        size, stride = tuple(shaped_like.size()), tuple(shaped_like.stride())
    if outer is not None:
        return layout.cls.__tensor_unflatten__(inner, layout.context, *outer)  # type: ignore[attr-defined]
    if runtime and not all(isinstance(d, int) for d in (*size, *stride)):
        size, stride = None, None
    return layout.cls.__tensor_unflatten__(inner, layout.context, size, stride)  # type: ignore[attr-defined]


def sizes_traced_when_used() -> contextlib.AbstractContextManager[None]:
    """While tracing, record size arithmetic only where a traced op uses its result, as AOT
    Autograd traces its joint: a jagged tensor built inside multiplies its ragged size (a nested
    int, which no graph value carries) by a stride that nothing may read."""
    from torch.fx.experimental.proxy_tensor import maybe_enable_thunkify

    return maybe_enable_thunkify()


def trace_flat(fn: Callable[..., Any], flat_args: Sequence[Any], arg_names: Sequence[str]) -> GraphModule:
    """Trace ``fn`` over plain fake tensors; the subclasses it builds inside dispatch to their
    inner tensors, so the graph holds plain-tensor ATen ops only."""
    from torch._subclasses.fake_tensor import FakeTensor

    fake_mode = next((x.fake_mode for x in flat_args if isinstance(x, FakeTensor)), None)
    context = fake_mode if fake_mode is not None else contextlib.nullcontext()
    with context, fx_traceback.preserve_node_meta():
        gm = make_fx(fn, pre_dispatch=False, record_module_stack=True)(*flat_args)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, name in zip(placeholders, arg_names):
        node.target = node.name = _identifier(name)
    gm.recompile()
    return gm


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)
