"""Own the ``flatten_subclasses`` stage: tensor subclasses taken apart before any pass runs.

A traceable wrapper subclass among a captured graph's inputs or outputs (``TwoTensor``,
``DTensor``, the jagged ``NestedTensor``, a subclass parameter) is flattened into its plain inner
tensors, recursively, before the pipeline sees the program: the graph is re-traced over the
inner tensors, so every op in it is a plain-tensor ATen op (the subclass's ``__torch_dispatch__``
ran while tracing), as AOT Autograd does in ``_aot_autograd/subclass_utils.py``. The program's
signature records the structure (``Signature.subclass_inputs`` and ``subclass_outputs``); passes
see plain tensors only.

At run time ``SubclassProgram`` takes the caller's subclass values apart on the way in and builds
the subclass outputs again on the way out. Two ``autograd.Function``s stand at that boundary, so
gradients flow as in eager: the gradient of a subclass output is taken apart into the tangents of
its inner tensors, and the inner tensors' gradients are built into the subclass gradient of the
input or parameter they came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.fx import GraphModule

from passkit import _torch
from passkit._torch import subclasses as torch_subclasses
from passkit._torch.subclasses import Layout
from passkit.errors import PasskitError
from passkit.core.program import Program, SubclassInfo
from passkit.autodiff.subclasses import CAPTURED_SOURCE, SubclassJoint, SubclassSource

__all__ = ["FlatGraph", "SubclassProgram", "flatten_subclasses", "record_subclasses", "with_subclasses", "flat_inputs"]

STAGE = "flatten_subclasses"


@dataclass
class FlatGraph:
    """A captured graph with its subclasses flattened: the graph, its inputs, and the layouts."""

    graph: GraphModule
    inputs: list[Any]
    input_layouts: list[Layout | None]
    output_layouts: list[Layout | None]
    input_names: list[str]  # the captured graph's, one per caller input
    symbolic: bool = False  # sizes are symbols: subclasses derive their outer size from inner tensors
    kinds: list[str] | None = None  # each flat input's kind, where the caller gave kinds


def _placeholder_values(gm: GraphModule, key: str) -> list[Any] | None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if not all(key in n.meta for n in placeholders):
        return None
    return [n.meta[key] for n in placeholders]


def _output_values(gm: GraphModule, key: str) -> list[Any]:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    return [r.meta.get(key) if isinstance(r, torch.fx.Node) else r for r in results]


def _refuse_opaque(names: Sequence[str], values: Sequence[Any]) -> None:
    for name, value in zip(names, values):
        if torch_subclasses.is_subclass(value) and not torch_subclasses.is_traceable(value):
            raise PasskitError(
                f"passkit: input '{name}' is a tensor subclass ({type(value).__name__}) without "
                "__tensor_flatten__/__tensor_unflatten__, so it cannot be compiled; implement them, or pass a plain tensor"
            )


def _leaf_stand_in(leaf: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The inner tensor as a program input: it needs grad where its subclass value does."""
    needs_grad = layout.requires_grad and (leaf.is_floating_point() or leaf.is_complex())
    return leaf.detach().requires_grad_(needs_grad) if needs_grad != leaf.requires_grad else leaf


def flatten_subclasses(
    gm: GraphModule, real_inputs: Sequence[Any], kinds: Sequence[str] | None = None
) -> FlatGraph | None:
    """The ``flatten_subclasses`` stage over one captured graph; None when it holds no subclass.

    Raises:
        PasskitError: an input is a subclass that cannot be flattened (no ``__tensor_flatten__``).
    """
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    traced_inputs = _placeholder_values(gm, "example_value")  # Dynamo's; make_fx's graphs have "val"
    traced_outputs = _output_values(gm, "example_value" if traced_inputs is not None else "val")
    _refuse_opaque(names, real_inputs)
    if not any(map(torch_subclasses.is_subclass, [*real_inputs, *traced_outputs])):
        return None
    # Sizes Dynamo made symbolic (a jagged dimension always is) stay its symbols: the layouts
    # and the flat trace come from its own fakes, in its fake mode.
    symbolic = traced_inputs is not None and _torch.has_symbolic_sizes(traced_inputs)
    described = traced_inputs if symbolic else real_inputs
    in_layouts = [torch_subclasses.layout_of(x) if torch_subclasses.is_subclass(x) else None for x in described]
    flat_inputs: list[Any] = []
    flat_names: list[str] = []
    flat_kinds: list[str] = []
    for name, value, layout, kind in zip(names, real_inputs, in_layouts, kinds or ["user"] * len(names)):
        if layout is None:
            flat_inputs.append(value)
            flat_names.append(name)
            flat_kinds.append(kind)
            continue
        flat_inputs += [_leaf_stand_in(leaf, layout) for leaf in torch_subclasses.flatten_value(value)]
        flat_names += layout.leaf_names(name)
        flat_kinds += [kind] * layout.leaves
    if symbolic:
        fakes = _flat_dynamo_fakes(traced_inputs, in_layouts)
    else:
        mode = _torch.fake_mode_of(flat_inputs) or _torch.new_fake_mode(shape_env=_torch.needs_shape_env(gm))
        fakes = [_torch.fakify(mode, x) for x in flat_inputs]
    out_layouts: list[Layout | None] = []

    def flat_fn(*flat: Any) -> tuple[Any, ...]:
        leaves = iter(flat)
        args = [
            next(leaves) if layout is None else torch_subclasses.unflatten_value(layout, leaves)
            for layout in in_layouts
        ]
        outs = torch.fx.Interpreter(gm).run(*args)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        out_layouts[:] = [torch_subclasses.layout_of(o) if torch_subclasses.is_subclass(o) else None for o in outs]
        flat_outs: list[Any] = []
        for out, layout in zip(outs, out_layouts):
            flat_outs += [out] if layout is None else torch_subclasses.flatten_value(out)
        return tuple(flat_outs)

    flat_gm = torch_subclasses.trace_flat(flat_fn, fakes, flat_names)
    if symbolic:  # capture then takes the inner tensors of Dynamo's fakes, not fresh static ones
        placeholders = [n for n in flat_gm.graph.nodes if n.op == "placeholder"]
        for node in flat_gm.graph.nodes:
            if node.op != "output" and "val" in node.meta:
                node.meta["example_value"] = node.meta["val"]
        for node, fake in zip(placeholders, fakes):
            node.meta["example_value"] = fake  # the trace's own copy lost requires_grad
    return FlatGraph(flat_gm, flat_inputs, in_layouts, list(out_layouts), names, symbolic, flat_kinds if kinds else None)


def _flat_dynamo_fakes(traced: Sequence[Any], layouts: Sequence[Layout | None]) -> list[Any]:
    fakes: list[Any] = []
    for value, layout in zip(traced, layouts):
        if layout is None:
            fakes.append(value)
        else:
            fakes += [_leaf_stand_in(leaf, layout) for leaf in torch_subclasses.flatten_value(value)]
    return fakes


def _infos(layouts: Sequence[Layout | None]) -> list[SubclassInfo]:
    infos, start = [], 0
    for position, layout in enumerate(layouts):
        width = 1 if layout is None else layout.leaves
        if layout is not None:
            infos.append(SubclassInfo(position, layout.describe(), tuple(range(start, start + width))))
        start += width
    return infos


def record_subclasses(program: Program, flat: FlatGraph, gm: GraphModule) -> SubclassSource:
    """Write the subclass structure into the program's signature (what passes can read), and
    keep the captured graph over subclass values for ``joint`` (``program.notes[CAPTURED_SOURCE]``)."""
    program.signature.subclass_inputs = _infos(flat.input_layouts)
    program.signature.subclass_outputs = _infos(flat.output_layouts)
    source = SubclassSource(gm, flat.input_layouts, flat.output_layouts, flat.input_names, flat.symbolic, flat.inputs)
    program.notes[CAPTURED_SOURCE] = source
    if torch.is_grad_enabled() and any(info.requires_grad for info in program.signature.inputs):
        # Which outputs need grad is decided by the subclass values, as eager's autograd sees them.
        SubclassJoint(program, source)
        program.training = any(info.requires_grad for info in program.signature.outputs)
    return source


class _Unwrap(torch.autograd.Function):
    """A subclass value to its inner tensors; their gradients become its gradient, built with
    the layout the traced gradient had."""

    @staticmethod
    def forward(ctx: Any, grad_layout: Layout | None, value: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        leaves = torch_subclasses.flatten_value(value)
        ctx.grad_layout = grad_layout
        ctx.set_materialize_grads(False)
        ctx.shapes = [(leaf.shape, leaf.dtype, leaf.device) for leaf in leaves]
        # A leaf without a gradient (a jagged tensor's offsets) is the input's own in its gradient.
        ctx.kept_leaves = {k: leaf for k, leaf in enumerate(leaves) if not (leaf.is_floating_point() or leaf.is_complex())}
        ctx.mark_non_differentiable(*(leaf for leaf in leaves if not (leaf.is_floating_point() or leaf.is_complex())))
        # Aliases, so the autograd graph records them without touching the value's own inner
        # tensors; the others are the value's own (outputs that share a jagged tensor's offsets
        # share its ragged size, as in eager).
        return tuple(leaf.detach() if k not in ctx.kept_leaves else leaf for k, leaf in enumerate(leaves))

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:  # type: ignore[override]
        if ctx.grad_layout is None or all(g is None for g in grads):
            return None, None
        filled = (
            g if g is not None else ctx.kept_leaves[k] if k in ctx.kept_leaves else torch.zeros(shape, dtype=dtype, device=device)
            for k, (g, (shape, dtype, device)) in enumerate(zip(grads, ctx.shapes))
        )
        return None, torch_subclasses.unflatten_value(ctx.grad_layout, filled, runtime=True)


def _as_traced_tangent(grad: Any, layout: Layout) -> Any:
    """The incoming gradient of a subclass output, laid out as the traced tangent was."""
    if not isinstance(grad, layout.cls):
        raise PasskitError(
            f"passkit: the gradient of a {layout.cls.__name__} output arrived as a {type(grad).__name__}; "
            f"pass a {layout.cls.__name__} gradient to backward()"
        )
    placements = getattr(grad, "placements", None)
    if placements is not None and tuple(placements) != tuple(layout.context[0]):
        # A DTensor gradient in other placements than the output (as AOT Autograd coerces it).
        grad = grad.redistribute(grad.device_mesh, layout.context[0])
    return grad


class _Wrap(torch.autograd.Function):
    """Inner tensors to the subclass output they make up; its gradient becomes their tangents."""

    @staticmethod
    def forward(ctx: Any, layout: Layout, *leaves: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.layout = layout
        # The subclass value carries the history; its inner tensors carry none, as in eager.
        plain = (leaf.detach() if isinstance(leaf, torch.Tensor) and leaf.requires_grad else leaf for leaf in leaves)
        return torch_subclasses.unflatten_value(layout, plain, runtime=True)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple[Any, ...]:  # type: ignore[override]
        return (None, *torch_subclasses.leaves_like(_as_traced_tangent(grad, ctx.layout), ctx.layout))


class SubclassProgram:
    """A compiled flat program called with, and returning, the caller's subclass values."""

    def __init__(self, compiled: Callable[..., Any], source: SubclassSource) -> None:
        self.compiled = compiled
        self.source = source

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        flat: list[Any] = []
        grad = torch.is_grad_enabled()
        for p, (value, layout) in enumerate(zip(args, self.source.input_layouts)):
            if layout is None:
                flat.append(value)
            elif grad and value.requires_grad:
                flat += _Unwrap.apply(self.source.grad_layouts.get(p), value)
            else:
                flat += torch_subclasses.flatten_value(value)
        outs = iter(self.compiled(*flat))
        results: list[Any] = []
        for layout in self.source.output_layouts:
            if layout is None:
                results.append(next(outs))
                continue
            leaves = [next(outs) for _ in range(layout.leaves)]
            if any(isinstance(leaf, torch.Tensor) and leaf.requires_grad for leaf in leaves):
                results.append(_Wrap.apply(layout, *leaves))
            else:
                results.append(torch_subclasses.unflatten_value(layout, iter(leaves), runtime=True))
        return tuple(results)


def with_subclasses(compiled: Callable[..., Any], program: Program) -> Callable[..., Any]:
    """``compiled`` as the caller calls it: with its subclass values, where the program has any."""
    source = program.notes.get(CAPTURED_SOURCE)
    return compiled if source is None else SubclassProgram(compiled, source)


def flat_inputs(program: Program, real_inputs: Sequence[Any]) -> list[Any]:
    """The inputs of the flat program (the subclass values' inner tensors), for compiling it."""
    source = program.notes.get(CAPTURED_SOURCE)
    return list(real_inputs) if source is None else source.flat_inputs
