"""Own Dynamo tracing each repeated layer once: the ``regions`` step's ``trace_once`` option.

With regions, every stage after Dynamo works on each distinct layer once, and what still grows
with depth is Dynamo's own trace of every copy (about 55 ms a layer of the acceptance block stack
on a 2-core CPU: most of what a 48-layer compile adds to a 24-layer one). Dynamo traces a
function marked with ``torch.compiler.nested_compile_region`` once and stamps the trace out for
every later call whose inputs match. ``passkit.compile`` therefore marks the layers for the
duration of each call of the compiled module:

- A layer is an item of an ``nn.ModuleList`` or ``nn.Sequential`` whose class appears there at
  least ``min_repeats`` times (the outermost such item: a layer inside a layer is not marked),
  and that holds modules of its own: a leaf (``Linear``, ``ReLU``) is a few ops, which the
  ``regions`` step would leave inline, and a call per leaf would cost steps.
- Its class is swapped for a subclass with the same names whose ``forward`` is marked, and put
  back when the call returns, so the user's model is unchanged between calls. The mark must be on
  the class: a mark bound to each instance makes torch stamp out the first layer's parameters
  (docs/regions.md, Known limits). Every call sets the same subclass, so Dynamo's guards hold.
- Dynamo leaves the first layer inline (its input needs no grad, the others' do); the ``regions``
  step joins it to the marked body.

Only ``passkit.compile`` of a module can do this: ``torch.compile(backend="passkit")`` hands
passkit the graph after Dynamo has traced it.
"""

from __future__ import annotations

import functools
import types
import weakref
from typing import Any, Callable

import torch
from torch import nn

from passkit.errors import PasskitError

__all__ = ["repeated_layers", "LayerMarks", "tracing_each_layer_once"]

_MARKED: weakref.WeakKeyDictionary[type, type] = weakref.WeakKeyDictionary()  # class -> its marked subclass
_MARKED_CLASSES: weakref.WeakSet[type] = weakref.WeakSet()


def repeated_layers(model: nn.Module, min_repeats: int = 2) -> list[nn.Module]:
    """The outermost items of ``model``'s ``ModuleList``s and ``Sequential``s whose class repeats."""
    layers: list[nn.Module] = []
    inside: set[str] = set()
    for name, module in model.named_modules():
        if name in inside or any(name.startswith(prefix + ".") for prefix in inside):
            continue
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        items = list(module.named_children())
        for item_name, item in items:
            kind = _original(type(item))
            if (next(item.children(), None) is not None and _markable(kind)
                    and sum(_original(type(other)) is kind for _, other in items) >= min_repeats):
                layers.append(item)
                inside.add(f"{name}.{item_name}" if name else item_name)
    return layers


def _original(kind: type) -> type:
    return kind.__mro__[1] if kind in _MARKED_CLASSES else kind


def _markable(kind: type) -> bool:
    forward = getattr(kind, "forward", None)
    if not callable(forward) or forward is nn.Module.forward:
        return False
    if hasattr(forward, "__marked_compile_region_fn__"):  # the user marked it already
        return False
    try:
        _marked(kind)
    except Exception:  # noqa: BLE001 - a class that refuses subclasses is traced as it is
        return False
    return True


def _marked(kind: type) -> type:
    if kind not in _MARKED:
        # torch notes its options on the function it marks: mark a copy, not the user's function.
        forward = torch.compiler.nested_compile_region(_copy(kind.forward))
        marked = type(kind.__name__, (kind,), {"forward": forward, "__module__": kind.__module__,
                                               "__qualname__": kind.__qualname__})
        _MARKED[kind] = marked
        _MARKED_CLASSES.add(marked)
    return _MARKED[kind]


def _copy(function: Any) -> Any:
    if not isinstance(function, types.FunctionType):
        return function
    copied = types.FunctionType(function.__code__, function.__globals__, function.__name__,
                                function.__defaults__, function.__closure__)
    copied.__kwdefaults__ = function.__kwdefaults__
    return functools.update_wrapper(copied, function)


class LayerMarks:
    """While inside, each of ``layers`` has its class's marked subclass as its ``__class__``."""

    def __init__(self, layers: list[nn.Module]) -> None:
        self._layers = layers
        self._saved: list[list[type]] = []

    def __enter__(self) -> LayerMarks:
        self._saved.append([type(layer) for layer in self._layers])
        for layer in self._layers:
            layer.__class__ = _marked(_original(type(layer)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for layer, kind in zip(self._layers, self._saved.pop()):
            layer.__class__ = kind


def tracing_each_layer_once(compiled: nn.Module, model: nn.Module, min_repeats: int = 2,
                            compiled_a_graph: Callable[[], bool] = lambda: False) -> list[str]:
    """Make every call of ``compiled`` (``torch.compile(model)``) run with ``model``'s repeated
    layers marked; the names of the classes marked, a list emptied when marking stops.

    Dynamo must trace a marked layer whole: a graph break inside one (T5's layers) fails the
    compile instead, and so does a layer called on a data-dependent size (MoE experts). If that happens before any graph was compiled (``compiled_a_graph``), no
    code of the model ran yet, and the call is traced again with no layer marked, as every call
    after it; later, a graph may have run already, and the failure is one line.
    """
    layers = repeated_layers(model, min_repeats)
    if not layers:
        return []
    marks = LayerMarks(layers)
    traced: Callable[..., Any] = compiled.forward
    names = sorted({type(layer).__qualname__ for layer in layers})

    @functools.wraps(traced)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not names:
            return traced(*args, **kwargs)
        try:
            with marks:
                return traced(*args, **kwargs)
        except Exception as exc:
            if not _uncaptured_region(exc):
                raise
            if compiled_a_graph():
                raise PasskitError(
                    f"trace_once: Dynamo cannot trace a marked layer ({', '.join(names)}) whole, "
                    "after part of the model ran; set trace_once = false on the regions step") from exc
            names.clear()
            return traced(*args, **kwargs)

    compiled.forward = forward
    return names


def _uncaptured_region(exc: BaseException) -> bool:
    """Dynamo's ``UncapturedHigherOrderOpError`` (a marked region it could not trace whole), or
    a guard on a data-dependent size (``GuardOnDataDependentSymNode``): a marked layer called on
    rows only the data counts (an MoE expert's tokens), where Dynamo's check whether an earlier
    trace of the layer fits compares two unbacked sizes it cannot decide."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ in ("UncapturedHigherOrderOpError", "GuardOnDataDependentSymNode"):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
