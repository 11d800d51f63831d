"""Own the runtime wrapper: calling a compiled program the way eager would have run it.

Training programs run through a ``torch.autograd.Function`` whose forward calls the compiled
``forward`` graph and whose backward calls the compiled ``backward`` graph. Around it the wrapper
writes input mutations back (BatchNorm running stats, ``x.add_()`` on an input, ``t_()``),
regenerates outputs that alias inputs so that ``out._base is inp`` holds as in eager (inside
the Function where a user's ``autograd.Function`` made them, so their gradient passes its
backward), makes outputs that view an intermediate outside the Function from its base (so
in-place writes to them work as in eager; not a view that reads an element twice, whose gradient
the base's cannot give), and restores grad mode. Every routing decision comes from the signature's descriptors.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from passkit import _torch
from passkit._torch.subclasses import unflatten_value
from passkit.autodiff.subclasses import CAPTURED_SOURCE
from passkit.runtime.entry_check import EntryCheck
from passkit.errors import PasskitError
from passkit.core.program import InputInfo, OutputInfo, Program
from passkit.runtime.output_views import (
    grads_of_views,
    geometry_now,
    view_in_dtype,
    views_of_inputs_made_here,
    with_intermediate_bases,
)
from passkit.runtime.shared_inputs import SharedStorageCheck

__all__ = ["CompiledProgram", "DOUBLE_BACKWARD_ERROR"]

DOUBLE_BACKWARD_ERROR = (
    "double backward through a passkit-compiled program is not supported; "
    "compute higher-order gradients in eager mode"
)


def _output_values(program: Program, graph: str) -> list[Any]:
    output = next(n for n in reversed(program.graphs[graph].graph.nodes) if n.op == "output")
    return [getattr(arg, "meta", {}).get("val", arg) for arg in output.args[0]]


def _saved_sharing_mutated_inputs(program: Program, saved_values: Sequence[Any], mutated: Sequence[int]) -> list[int]:
    """The saved slots whose traced value shares storage with an input the program mutates
    (a saved input, or a view of one); a value computed in the program never does."""
    if not mutated:
        return []
    placeholders = [n for n in program.graphs["forward"].graph.nodes if n.op == "placeholder"]
    mutated_storages = {
        _torch.storage_of(node.meta.get("val"))
        for node, desc in zip(placeholders, program.io("forward").inputs)
        if desc.kind in ("param", "buffer", "user") and desc.index in mutated
    } - {None}
    return [
        k for k, value in enumerate(saved_values)
        if isinstance(value, torch.Tensor) and _torch.storage_of(value) in mutated_storages
    ]


def _mark_non_differentiable(ctx: Any, visible: tuple[Any, ...], slots: Sequence[int]) -> tuple[Any, ...]:
    """Mark the outputs in ``slots`` non-differentiable, and no other output.

    A code generator may return one tensor object in several slots (Inductor returns ``mul``
    for both ``mul`` and ``alias(mul)``); marking it would cut the gradient of the slot that
    needs one, so such a slot gets its own alias first.
    """
    ids = [id(v) for v in visible]
    out = list(visible)
    for k in slots:
        value = out[k]
        # Autograd leaves a view marked so needing grad (as a view made under ``no_grad``), but
        # ``v.detach()`` returned beside ``v`` needs none in eager.
        if isinstance(value, torch.Tensor) and (ids.count(id(value)) > 1 or value._is_view()):
            out[k] = value.detach()
    ctx.mark_non_differentiable(*(out[k] for k in slots if isinstance(out[k], torch.Tensor)))
    return tuple(out)


class _CompiledFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, runtime: CompiledProgram, *args: Any) -> tuple[Any, ...]:  # type: ignore[override]
        outs = runtime.forward_fn(*args)
        if runtime.function_views:
            outs = views_of_inputs_made_here(outs, args, runtime.function_views)
        n_visible = runtime.n_visible
        ctx.runtime = runtime
        if runtime.grad_layouts:  # a plain input's subclass gradient is built as large as the input
            ctx.grad_geometry = {i: (tuple(args[i].size()), tuple(args[i].stride())) for i in runtime.grad_layouts}
        if runtime.non_differentiable:
            # Autograd would hand the backward a zero tensor for every output without a gradient
            # (each running statistic a BatchNorm updates, on every step); only the outputs the
            # backward reads get zeros, made here when no gradient arrives.
            ctx.set_materialize_grads(False)
            ctx.tangent_meta = [(k, outs[k].shape, outs[k].dtype, outs[k].device) for k in runtime.tangent_slots]
        if runtime.lean_saves:
            # Every saved value a tensor, no input mutated: save them as they come.
            ctx.save_for_backward(*outs[n_visible:])
            visible = tuple(outs[:n_visible])
            if runtime.non_differentiable:
                visible = _mark_non_differentiable(ctx, visible, runtime.non_differentiable)
            return with_intermediate_bases(ctx, runtime, visible, args)
        saved = list(outs[n_visible:])
        for k in runtime.saved_inputs_to_clone(saved, args):
            saved[k] = saved[k].clone()
        tensor_slots = [k for k, v in enumerate(saved) if isinstance(v, torch.Tensor)]
        ctx.save_for_backward(*(saved[k] for k in tensor_slots))
        ctx.tensor_slots = tensor_slots
        ctx.other_saved = {k: v for k, v in enumerate(saved) if not isinstance(v, torch.Tensor)}
        ctx.n_saved = len(saved)
        visible = tuple(outs[:n_visible])
        if runtime.non_differentiable:
            visible = _mark_non_differentiable(ctx, visible, runtime.non_differentiable)
        return with_intermediate_bases(ctx, runtime, visible, args)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> tuple[Any, ...]:  # type: ignore[override]
        if torch.is_grad_enabled():
            raise PasskitError(DOUBLE_BACKWARD_ERROR)
        runtime: CompiledProgram = ctx.runtime
        if runtime.view_slots:
            grad_outputs = grads_of_views(ctx.view_geometry, grad_outputs[:-1])
        if runtime.non_differentiable:
            grad_outputs = list(grad_outputs)
            for k, size, dtype, device in ctx.tangent_meta:
                if grad_outputs[k] is None:
                    grad_outputs[k] = torch.zeros(size, dtype=dtype, device=device)
        if runtime.backward_boxed is not None:
            args = runtime.backward_args(ctx, grad_outputs)
            # Only the list holds the saved tensors now (unless the graph is kept for another
            # backward), so each dies as soon as the compiled backward is done with it.
            ctx.maybe_clear_saved_tensors()
            grads = runtime.backward_boxed(args)
        elif runtime.lean_saves and runtime.lean_gather:
            grads = runtime.backward_fn(*ctx.saved_tensors, *grad_outputs)
        else:
            grads = runtime.backward_fn(*runtime.backward_args(ctx, grad_outputs))
        if runtime.grads_in_input_order:
            return (None, *grads)
        if runtime.grad_layouts:
            return (None, *_built_grads(runtime, grads, ctx.grad_geometry))
        result: list[Any] = [None] * runtime.n_inputs
        for target, grad in zip(runtime.grad_targets, grads):
            result[target] = grad
        return (None, *result)


def _built_grads(runtime: CompiledProgram, grads: Sequence[Any], geometry: dict[int, Any]) -> list[Any]:
    """Each input's gradient, a plain input's subclass gradient built from its inner tensors."""
    parts: dict[int, list[Any]] = {}
    for target, grad in zip(runtime.grad_targets, grads):
        parts.setdefault(target, []).append(grad)
    result: list[Any] = [None] * runtime.n_inputs
    for target, leaves in parts.items():
        layout = runtime.grad_layouts.get(target)
        if layout is None or all(leaf is None for leaf in leaves):
            result[target] = leaves[0]
        else:
            result[target] = unflatten_value(layout, iter(leaves), runtime=True, outer=geometry[target])
    return result


def _inputs_without_gradient(program: Program, grad_targets: Sequence[int]) -> list[int]:
    """The non-leaf inputs that need grad whose every gradient slot in the backward graph is
    None (a leaf's None is enough: nothing is accumulated). One whose metadata the graph
    changes is kept: the change must reach the caller's tensor."""
    returned = program.graphs["backward"].graph.output_node().args[0]
    given = {target for target, grad in zip(grad_targets, returned) if grad is not None}
    return [i for i, info in enumerate(program.signature.inputs)
            if info.requires_grad and not info.is_leaf and not info.mutates_metadata and i not in given]


def _detached(args: Sequence[Any], indices: Sequence[int]) -> list[Any]:
    call_args = list(args)
    for i in indices:
        if isinstance(call_args[i], torch.Tensor):
            call_args[i] = call_args[i].detach()
    return call_args


class CompiledProgram:
    """A compiled program as a callable over flat inputs, returning a tuple of user outputs."""

    def __init__(self, program: Program, *, compiled_by: str = "the compiled program") -> None:
        sig = program.signature
        # ``compiled_by`` names the step whose code a refused value was about to enter.
        self.entry_check = EntryCheck([info.name for info in sig.inputs], program.example_inputs, compiled_by)
        self.inputs: list[InputInfo] = sig.inputs
        self.outputs: list[OutputInfo] = sig.outputs
        self.n_inputs = len(sig.inputs)
        self.training = "forward" in program.graphs
        graph = "forward" if self.training else "main"
        io = program.io(graph)
        visible = io.outputs[: io.n_visible]
        self.n_visible = io.n_visible
        self.mutation_slots = [(k, d.index) for k, d in enumerate(visible) if d.kind == "mutation"]
        self.user_slots = [k for k, d in enumerate(visible) if d.kind == "user"]
        self.mutated = [i for i, info in enumerate(sig.inputs) if info.mutated]
        self.shared_storage_check = SharedStorageCheck(
            self.mutated, static_shapes=not _torch.has_symbolic_sizes(program.example_inputs))
        self.views_of_outputs = [
            (k, info.alias_of_output) for k, info in enumerate(sig.outputs) if info.alias_of_output is not None
        ]
        # User outputs that may view an intermediate (checked per call, see output_views.with_intermediate_bases).
        self.view_slots = [
            k
            for k, info in zip(self.user_slots, sig.outputs)
            if info.is_tensor and info.alias_of_input is None and info.alias_of_output is None
        ] if "forward" in program.graphs else []
        # Outputs an autograd.Function made that share an input's memory (torch's
        # ``custom_function_view``): made inside the wrapper's Function, never from the input.
        self.function_views: list[tuple[int, int, Any]] = [
            (k, info.alias_of_input, info.view, info.view_symbols)  # type: ignore[misc]
            for k, info in zip(self.user_slots, sig.outputs)
            if info.made_by_function and info.alias_of_input is not None and info.view is not None
        ] if self.training else []
        if self.training:
            self.forward_fn: Callable[..., Any] = program.compiled["forward"]
            self.backward_fn: Callable[..., Any] = program.compiled["backward"]
            # A backward that takes its inputs as a list it may empty (``codegen.inductor``).
            self.backward_boxed: Callable[[list[Any]], Any] | None = getattr(self.backward_fn, "passkit_boxed", None)
            bw_io = program.io("backward")
            self.backward_gather = [(d.kind == "saved", d.index) for d in bw_io.inputs]
            differentiable = {d.index for d in bw_io.inputs if d.kind == "tangent"}
            # An output eager marks as needing grad keeps it even where no gradient reaches an
            # input (``bernoulli``, ``x.zero_()``), as in eager.
            wants_grad = {k for k, info in zip(self.user_slots, sig.outputs) if info.requires_grad}
            self.non_differentiable = [
                k for k in range(self.n_visible) if k not in differentiable and k not in wants_grad
            ]
            self.tangent_slots = sorted(differentiable)
            self.grad_targets = [d.index for d in bw_io.outputs]
            # Routing the common case needs no per-call bookkeeping: decided once, here.
            saved_values = _output_values(program, "forward")[self.n_visible :]
            self.clone_candidates = _saved_sharing_mutated_inputs(program, saved_values, self.mutated)
            self.lean_saves = not self.clone_candidates and all(isinstance(v, torch.Tensor) for v in saved_values)
            n_saved = len(saved_values)
            self.lean_gather = self.backward_gather == [(True, k) for k in range(n_saved)] + [
                (False, k) for k in range(self.n_visible)
            ]
            self.grads_in_input_order = self.grad_targets == list(range(self.n_inputs))
            source = program.notes.get(CAPTURED_SOURCE)
            self.grad_layouts = {} if source is None else source.plain_grad_layouts()
            # Inputs that need grad but get none from the backward (read only by dead code, or
            # through ops without a derivative) are detached before the call, as torch's AOT
            # detaches them. Else autograd goes on into the tape that made them with zeros: a
            # parameter whose grad stays None in eager got a zero grad (which AdamW decays).
            self.never_grad = [] if self.grad_layouts else _inputs_without_gradient(program, self.grad_targets)
        else:
            self.main_fn: Callable[..., Any] = program.compiled["main"]
        self.plain_outputs = (
            not self.mutation_slots
            and self.user_slots == list(range(self.n_visible))
            and all(info.alias_of_input is None for info in self.outputs)
            and not (self.training and self.views_of_outputs)
        )

    def backward_args(self, ctx: Any, grad_outputs: Sequence[Any]) -> list[Any]:
        """The backward graph's inputs: saved values and incoming gradients, in its order."""
        if self.lean_saves and self.lean_gather:
            return [*ctx.saved_tensors, *grad_outputs]
        if self.lean_saves:
            saved: list[Any] = list(ctx.saved_tensors)
        else:
            saved = [None] * ctx.n_saved
            for slot, tensor in zip(ctx.tensor_slots, ctx.saved_tensors):
                saved[slot] = tensor
            for slot, value in ctx.other_saved.items():
                saved[slot] = value
        return [saved[i] if is_saved else grad_outputs[i] for is_saved, i in self.backward_gather]

    def saved_inputs_to_clone(self, saved: Sequence[Any], args: Sequence[Any]) -> list[int]:
        """Saved values sharing storage with inputs the wrapper will overwrite.

        The backward needs the old data, and autograd would reject the bumped version counter.
        Only the saved values that the trace shows sharing a mutated input's storage are looked at.
        """
        if not self.clone_candidates:
            return []
        storages = {args[i].untyped_storage().data_ptr() for i in self.mutated}
        return [
            k
            for k in self.clone_candidates
            if isinstance(saved[k], torch.Tensor) and saved[k].untyped_storage().data_ptr() in storages
        ]

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        self.entry_check(args)
        if self.mutated:
            self.shared_storage_check(args)
        if self.training:
            visible = _CompiledFunction.apply(self, *(_detached(args, self.never_grad) if self.never_grad else args))
            if self.view_slots:
                *visible, geometry = visible
                for k, (size, stride, offset) in geometry.items():
                    visible[k] = visible[k].as_strided(size, stride, offset)
        else:
            grad_enabled = torch.is_grad_enabled()
            visible = self.main_fn(*args)
            _torch.set_grad_enabled(grad_enabled)
        if self.plain_outputs:
            return tuple(visible)
        for k, index in self.mutation_slots:
            self._write_back(args[index], visible[k], self.inputs[index])
        outputs = [self._user_output(args, visible[k], info) for k, info in zip(self.user_slots, self.outputs)]
        if self.training:
            # A view returned with its base is re-made from the base the caller gets, so that
            # in-place changes to either behave as in eager (autograd rejects in-place changes
            # to several views returned by one autograd.Function).
            for k, j in self.views_of_outputs:
                info = self.outputs[k]
                geometry = geometry_now(info.view, visible[self.user_slots[k]], outputs[j], args, info.view_symbols)
                if geometry is not None:
                    outputs[k] = outputs[j].as_strided(*geometry)
        return tuple(outputs)

    @staticmethod
    def _write_back(target: torch.Tensor, new: torch.Tensor | None, info: InputInfo) -> None:
        if new is None:  # the compiled graph wrote it itself (codegen.inductor, a buffer's update)
            return
        if info.mutates_metadata:
            with torch.no_grad():
                target.as_strided_(new.size(), new.stride(), new.storage_offset())
        if not info.mutates_data:
            return
        # Eager refuses a write autograd sees into a leaf that requires grad, so a write into one
        # that got here went through ``.detach()``: hidden from autograd, as it was there.
        # An input that needs no grad, given a value that does (``x.add_(w)``), takes its history
        # as eager's in-place op gives it (torch's AOT copies back under autograd alike).
        visible = not info.mutated_under_no_grad and (
            (info.requires_grad and not info.is_leaf) or (new.requires_grad and not target.requires_grad))
        if visible and torch.is_grad_enabled():
            target.copy_(new)  # differentiable: later uses see the new value's history
        else:
            with torch.no_grad():
                target.copy_(new)

    @staticmethod
    def _user_output(args: Sequence[Any], value: Any, info: OutputInfo) -> Any:
        if info.alias_of_input is None or info.made_by_function:
            return value
        base = args[info.alias_of_input]
        if info.is_input:
            return base
        if info.detached or (base.requires_grad and not info.requires_grad):
            base = base.detach()  # ``a.detach()`` returned: shares a's memory, not its history
        geometry = geometry_now(info.view, value, base, args, info.view_symbols)  # type: ignore[arg-type]
        if geometry is None:
            return value  # a symbol no input gives: the computed value, unaliased
        size, stride, offset = geometry
        if info.detached and (tuple(base.shape), base.stride(), base.storage_offset()) == (size, stride, offset):
            return base  # not a view, as eager's
        if isinstance(value, torch.Tensor) and value.dtype != base.dtype:
            alias = view_in_dtype(base, value, size, stride, offset)
        else:
            alias = base.as_strided(size, stride, offset)
        if info.multi_output_view:
            # Made by ``unbind`` as eager's was, so autograd refuses in-place writes to it alike.
            alias = alias.unsqueeze(0).unbind(0)[0]
        if info.requires_grad and not alias.requires_grad:
            alias.requires_grad_(True)  # ``a.view(-1).requires_grad_()`` on an input that needs no grad
        return alias
