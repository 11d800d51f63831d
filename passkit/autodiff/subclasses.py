"""Own differentiating a program whose caller passes tensor subclasses: autograd at their level.

``flatten_subclasses`` gives the passes a ``main`` over plain inner tensors. Its gradient cannot
be taken there: eager differentiates the subclass values, and the subclass decides what a
gradient is (a ``DTensor``'s replicated input gets the sum of its shards' partial gradients, a
plain bias added to a ``TwoTensor`` gets a ``TwoTensor`` gradient). So, as AOT Autograd does, the
joint is traced with autograd over the subclass values of the captured graph (``SubclassSource``)
and flattened as it is traced: the joint graph holds plain-tensor ATen ops only, forward and
backward. The tangents of a subclass output are its inner tensors' tangents, and each gradient
is recorded with its own layout (``SubclassSource.grad_layouts``), which the runtime wrapper
builds it back into.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch.fx import GraphModule

from passkit import _torch
from passkit._torch import subclasses as torch_subclasses
from passkit._torch.subclasses import Layout
from passkit.errors import PasskitError
from passkit.core.program import Program

__all__ = ["CAPTURED_SOURCE", "CAPTURED_SOURCE_UNCACHED", "SubclassSource", "SubclassJoint"]

# The note that holds a program's ``SubclassSource``: the graph ``joint`` differentiates.
CAPTURED_SOURCE = "captured_source"
CAPTURED_SOURCE_UNCACHED = (
    "its joint is differentiated from the captured graph (tensor subclasses, a custom autograd.Function, "
    "a jagged tensor built inside, or an in-place write autograd does not record), which the cache key does not cover"
)


@dataclass
class SubclassSource:
    """The captured graph over subclass values, and how its values map to the flat program."""

    graph: GraphModule | Callable[..., Any]  # or the user's function, where its trace lost a Function's backward
    input_layouts: list[Layout | None]
    output_layouts: list[Layout | None]
    input_names: list[str]  # one per caller input
    symbolic: bool
    flat_inputs: list[Any] = field(default_factory=list)  # the real inner tensors it was compiled for
    grad_layouts: dict[int, Layout] = field(default_factory=dict)
    # Over plain inputs: the captured main, which differentiates as eager until a step re-traces it.
    captured_main: Any = None
    # Why ``joint`` differentiates this graph rather than the functional main (its report row says).
    reason: str = "tensor subclasses"

    @functools.cached_property
    def builds_nested(self) -> bool:
        """Whether the graph builds a jagged tensor itself (``joint`` then traces sizes lazily)."""
        return isinstance(self.graph, GraphModule) and _torch.builds_nested(self.graph)

    def plain_grad_layouts(self) -> dict[int, Layout]:
        """The subclass layouts of plain inputs' gradients, by flat input position."""
        spans = self.spans(self.input_layouts)
        return {spans[p][0]: grad for p, grad in self.grad_layouts.items() if self.input_layouts[p] is None}

    def spans(self, layouts: Sequence[Layout | None]) -> list[range]:
        """Which flat positions each value takes."""
        spans, start = [], 0
        for layout in layouts:
            width = 1 if layout is None else layout.leaves
            spans.append(range(start, start + width))
            start += width
        return spans


def _is_float(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex())


class SubclassJoint:
    """The joint function of a subclass program: ``f(*flat primals, *tangents) -> (*flat outputs, *grads)``."""

    def __init__(self, program: Program, source: SubclassSource) -> None:
        io = program.io("main")
        self.source = source
        self.in_spans = source.spans(source.input_layouts)
        self.out_spans = source.spans(source.output_layouts)
        owner = {i: p for p, span in enumerate(self.in_spans) for i in span}
        # Inputs the program writes in place, in the order of its leading ``mutation`` outputs;
        # known once ``functionalize`` ran (capture's run clones every input instead).
        self.mutated = [owner[d.index] for d in io.outputs if d.kind == "mutation"]
        if any(source.input_layouts[p] is not None for p in self.mutated):
            raise PasskitError(
                "passkit: a program over tensor subclasses mutates an input; "
                "training such a program is not supported, so compile it without the in-place update"
            )
        inputs = program.signature.inputs
        # The values eager differentiates: a subclass input if it needs grad, a plain one likewise.
        self.wrt = [
            p for p, (layout, span) in enumerate(zip(source.input_layouts, self.in_spans))
            if (layout.requires_grad if layout is not None else inputs[span[0]].requires_grad)
        ]
        functional = "functional" in program.facts
        with program.fake_mode, torch.enable_grad():
            outs = self._run(program.example_inputs, fresh=None if functional else range(len(self.in_spans)))
            self.diff_values = [j for j, out in enumerate(outs) if _is_float(out) and out.requires_grad]
            flat_outs = self._flatten(outs)
            # A write the runtime puts back under no_grad carries no gradient back, as in eager.
            self.diff_mutations = [
                m for m, p in enumerate(self.mutated)
                if _is_float(self.last_args[p]) and self.last_args[p].requires_grad
                and not inputs[self.in_spans[p][0]].mutated_under_no_grad
            ]
            self.diff_user = [k for j in self.diff_values for k in self.out_spans[j] if _is_float(flat_outs[k])]
            self.diff_outputs = self.diff_mutations + [len(self.mutated) + k for k in self.diff_user]
            self.tangent_examples = [torch.empty_like(self.last_args[self.mutated[m]]) for m in self.diff_mutations]
            self.tangent_examples += [torch.empty_like(flat_outs[k]) for k in self.diff_user]
            self._record_grad_layouts(program, outs)
        # One gradient output per input that requires grad; a plain input whose gradient is a
        # subclass (a plain weight times a TwoTensor) has one per inner tensor of that gradient,
        # which the runtime builds into it (``SubclassSource.plain_grad_layouts``).
        self.grad_inputs = [
            i for i, info in enumerate(inputs) if info.requires_grad
            for _ in range(self._plain_grad_width(owner[i]))
        ]
        for info in program.signature.outputs:
            info.requires_grad = False
        for j in self.diff_values:
            for k in self.out_spans[j]:
                program.signature.outputs[k].requires_grad = _is_float(flat_outs[k])

    def _args(self, primals: Sequence[Any], fresh: Any) -> list[Any]:
        args = []
        self.copied = set()
        self.last_primals = list(primals)
        for p, (layout, span) in enumerate(zip(self.source.input_layouts, self.in_spans)):
            if layout is None:
                value = primals[span[0]]
                if p in self.wrt and not value.requires_grad:  # verification passes detached values
                    value = self.last_primals[span[0]] = value.detach().requires_grad_(True)
                # Written in place: a copy, so that autograd sees the input before the write
                # (as AOT Autograd clones such an input) and the primal itself stays unwritten.
                if p in fresh and isinstance(value, torch.Tensor):
                    self.copied.add(p)
                    value = value.clone()
                args.append(value)
                continue
            leaves = iter(primals[k].detach() for k in span)
            value = torch_subclasses.unflatten_value(layout, leaves)
            if layout.requires_grad and not value.requires_grad:
                value.requires_grad_(True)
            args.append(value)
        return args

    def _run(self, primals: Sequence[Any], fresh: Any = None) -> list[Any]:
        # The subclass values of this run stay for ``_grads``, which differentiates with respect to them.
        self.last_args = self._args(primals, self.mutated if fresh is None else fresh)
        graph = self.source.graph
        outs = torch.fx.Interpreter(graph).run(*self.last_args) if isinstance(graph, GraphModule) else graph(*self.last_args)
        return list(outs) if isinstance(outs, (tuple, list)) else [outs]

    def _flatten(self, outs: Sequence[Any]) -> list[Any]:
        flat: list[Any] = []
        for out, layout in zip(outs, self.source.output_layouts):
            flat += [out] if layout is None else torch_subclasses.flatten_value(out)
        return flat

    def _grads(self, outs: Sequence[Any], tangents: Sequence[Any], flat_outs: Sequence[Any]) -> list[Any]:
        n_mutations = len(self.diff_mutations)
        by_leaf = dict(zip(self.diff_user, tangents[n_mutations:]))
        targets = [self.last_args[self.mutated[m]] for m in self.diff_mutations]
        grad_outputs = list(tangents[:n_mutations])
        for j in self.diff_values:
            layout, span = self.source.output_layouts[j], self.out_spans[j]
            targets.append(outs[j])
            if layout is None:
                grad_outputs.append(by_leaf[span[0]])
            else:
                # A leaf without a tangent (a jagged tensor's offsets) is the output's own.
                leaves = iter(by_leaf.get(k, flat_outs[k]) for k in span)
                grad_outputs.append(torch_subclasses.unflatten_value(layout, leaves, shaped_like=outs[j]))
        # Each input's gradient is taken at the value the caller passed, not the copy that was written.
        wrt = [self.last_primals[self.in_spans[p][0]] if p in self.copied else self.last_args[p] for p in self.wrt]
        return list(torch.autograd.grad(targets, wrt, grad_outputs, allow_unused=True))

    def _record_grad_layouts(self, program: Program, outs: Sequence[Any]) -> None:
        tangents = [torch.ones_like(t) for t in self.tangent_examples]
        grads = self._grads(outs, tangents, self._flatten(outs))
        for p, grad in zip(self.wrt, grads):
            layout = self.source.input_layouts[p]
            name = self.source.input_names[p]
            if grad is None:
                continue
            if layout is None and torch_subclasses.is_subclass(grad):
                self.source.grad_layouts[p] = torch_subclasses.layout_of(grad)
            if layout is not None:
                grad_layout = torch_subclasses.layout_of(grad) if torch_subclasses.is_subclass(grad) else None
                if grad_layout is None or grad_layout.leaves != layout.leaves:
                    raise PasskitError(
                        f"passkit: the gradient of input '{name}' ({layout.describe()}) is a "
                        f"{grad_layout.describe() if grad_layout else type(grad).__name__}; "
                        "a compiled program needs it built like the input"
                    )
                self.source.grad_layouts[p] = grad_layout

    def _plain_grad_width(self, p: int) -> int:
        """How many gradient outputs caller input ``p`` has, if it is plain: one, or one per inner
        tensor of its subclass gradient."""
        grad_layout = self.source.grad_layouts.get(p)
        return grad_layout.leaves if self.source.input_layouts[p] is None and grad_layout is not None else 1

    def __call__(self, *flat: Any) -> tuple[Any, ...]:
        n = sum(len(span) for span in self.in_spans)
        primals, tangents = flat[:n], flat[n:]
        # Only where a jagged tensor is built inside: its nested int has no proxy. Elsewhere lazy
        # size arithmetic chains thunks that overflow the stack (DTensor with symbolic sizes).
        lazy = self.source.builds_nested
        with torch_subclasses.sizes_traced_when_used() if lazy else contextlib.nullcontext():
            with torch.enable_grad():
                outs = self._run(primals)
            flat_outs = self._flatten(outs)
            grads = self._grads(outs, tangents, flat_outs) if self.diff_outputs and self.wrt else [None] * len(self.wrt)
        grad_of = dict(zip(self.wrt, grads))
        owner = {i: p for p, span in enumerate(self.in_spans) for i in span}
        flat_grads: list[Any] = []
        for i in dict.fromkeys(self.grad_inputs):
            p = owner[i]
            grad = grad_of.get(p)
            width = self._plain_grad_width(p)
            if width > 1:
                flat_grads += torch_subclasses.flatten_value(grad) if torch_subclasses.is_subclass(grad) else [None] * width
            elif grad is None or self.source.input_layouts[p] is None:
                flat_grads.append(grad)
            else:
                flat_grads.append(torch_subclasses.flatten_value(grad)[i - self.in_spans[p][0]])
        written = [self.last_args[p] for p in self.mutated]
        return (*written, *flat_outs, *flat_grads)
