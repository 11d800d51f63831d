"""Own tracing: fake tensors, functional tracing (``make_fx`` under ``FunctionalTensorMode``),
and re-tracing graphs on their own values. The layouts and random fills tracing must keep are
``layouts``'s and ``random_fills``'s, whose names are re-exported here.
"""

from __future__ import annotations

import contextlib
import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx
from torch.fx import GraphModule
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch._ops import OpOverload, OpOverloadPacket
from torch._dispatch.python import enable_python_dispatcher as python_dispatcher
from torch.utils import _pytree as pytree

from passkit._torch.layouts import LayoutKeepingInterpreter, bodies_keeping_layout, with_layout
from passkit._torch.random_fills import BERNOULLI_IN_LAYOUT, KeepRandomFillLayout
from passkit._torch.ops import has_symbolic_sizes
from passkit._torch.regions import region_schemas_remembered
from passkit._torch.hops import called_subgraphs, fresh_subgraph_caches, subgraphs_traced_in
from passkit._torch.unbacked import forget_pending_unbacked, retrying_with_shape_env

__all__ = [
    "autocast_state",
    "BERNOULLI_IN_LAYOUT",
    "FakeTensor",
    "FakeTensorMode",
    "InputMutation",
    "LayoutKeepingInterpreter",
    "bodies_keeping_layout",
    "OpOverload",
    "OpOverloadPacket",
    "fake_mode_of",
    "in_fake_mode",
    "fakify",
    "functional_trace",
    "holds_fake_constants",
    "is_activation_checkpoint",
    "keeps_grad_mode_regions",
    "new_fake_mode",
    "nothing_to_decompose",
    "pytree",
    "retrace",
    "saved_tensors_hooks_deferred",
    "set_grad_enabled",
    "trace_graph",
    "uses_functorch",
    "with_layout",
]


# Grad mode as a plain call: what Dynamo and pre-dispatch graphs record for ``no_grad`` blocks.
set_grad_enabled = torch._C._set_grad_enabled

def new_fake_mode(*, shape_env: bool = False) -> FakeTensorMode:
    """A fake mode for static shapes; ``shape_env`` gives it a symbol table all the same, which
    ``while_loop`` needs for its fake rule (see ``needs_shape_env``)."""
    if not shape_env:
        return FakeTensorMode(allow_non_fake_inputs=True)
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


def autocast_state() -> dict[str, str]:
    """Each device where autocast is on, with the dtype it casts to: tracing bakes its casts into
    the graph, which Dynamo's graph does not show when autocast was entered outside it."""
    devices = getattr(torch._C, "_autocast_supported_devices", lambda: ["cpu", "cuda"])()
    return {device: str(torch.get_autocast_dtype(device)) for device in devices if torch.is_autocast_enabled(device)}


def fakify(mode: FakeTensorMode, value: Any) -> Any:
    """A fake twin of ``value`` (same shape, dtype, strides, requires_grad), an autograd leaf;
    non-tensors pass."""
    if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
        fake = mode.from_tensor(value, static_shapes=True)
        return fake
    if isinstance(value, FakeTensor) and value.grad_fn is not None:
        # Dynamo's DDP optimizer hands each piece the previous piece's fake outputs, history
        # and all: differentiating through that history added the previous piece's gradient
        # paths (and its fake values, as constants) to this one's, and freed its saved values.
        return value.detach().requires_grad_(value.requires_grad)
    return value


def fake_mode_of(values: Sequence[Any]) -> FakeTensorMode | None:
    for value in values:
        if isinstance(value, FakeTensor):
            return value.fake_mode
    return None


@contextlib.contextmanager
def in_fake_mode(fake_mode: FakeTensorMode | None) -> Iterator[None]:
    """Trace in ``fake_mode``, which torch's own lookups then find too (see
    ``subgraphs_traced_in``)."""
    if fake_mode is None:
        yield
        return
    forget_pending_unbacked(fake_mode)
    with subgraphs_traced_in(fake_mode), fake_mode:
        yield


@dataclass
class InputMutation:
    """What a functional trace saw happen to one input."""

    index: int
    data: bool
    metadata: bool
    under_no_grad: bool


def _to_functional(value: Any) -> Any:
    return FunctionalTensor.to_functional(value) if isinstance(value, torch.Tensor) else value


def _from_functional(value: Any) -> Any:
    if isinstance(value, FunctionalTensor):
        torch._sync(value)
        return torch._from_functional_tensor(value.elem)
    return value


def functional_trace(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    pre_dispatch: bool,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    arg_names: Sequence[str] | None = None,
) -> tuple[GraphModule, list[InputMutation]]:
    """Trace ``fn`` with ``make_fx`` under ``FunctionalTensorMode``.

    The traced graph returns ``(*new values of mutated inputs, *flat outputs of fn)``; the
    returned list says which inputs were mutated and how. ``pre_dispatch`` keeps
    ``_set_grad_enabled`` regions in the graph, so ``no_grad`` blocks survive for the joint
    trace. Placeholders are renamed to ``arg_names`` when given.
    """
    mutations: list[InputMutation] = []

    def functionalized(*flat_args: Any) -> tuple[Any, ...]:
        mutations.clear()
        # Post-dispatch only: a pre-dispatch trace keeps dropout whole for a later trace.
        keep_layout = contextlib.nullcontext() if pre_dispatch else KeepRandomFillLayout()
        with FunctionalTensorMode(pre_dispatch=pre_dispatch, _allow_token_discovery=True), keep_layout:
            wrapped = [_to_functional(a) for a in flat_args]
            outs = fn(*wrapped)
        flat_outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        new_values = []
        for index, wrapped_arg in enumerate(wrapped):
            if not isinstance(wrapped_arg, FunctionalTensor):
                continue
            torch._sync(wrapped_arg)
            inner = wrapped_arg.elem
            data = torch._functionalize_has_data_mutation(inner)
            metadata = torch._functionalize_has_metadata_mutation(inner)
            if not (data or metadata):
                continue
            under_no_grad = bool(torch._functionalize_are_all_mutations_under_no_grad_or_inference_mode(inner))
            mutations.append(InputMutation(index, data, metadata, under_no_grad))
            new_values.append(_from_functional(wrapped_arg))
        return (*new_values, *[_from_functional(o) for o in flat_outs])

    gm = _traced(functionalized, args, decompositions, pre_dispatch)
    _drop_unused_effect_tokens(gm, len(args))
    if arg_names is not None:
        _rename_placeholders(gm, arg_names)
    _record_constant_inputs(gm, args)
    return gm, list(mutations)


def _traced(
    fn: Callable[..., Any], args: Sequence[Any], decompositions: dict[Any, Callable[..., Any]] | None, pre_dispatch: bool,
    *, record_module_stack: bool = True,
) -> GraphModule:
    """``make_fx`` of ``fn`` in the fake mode of ``args``, retried when a kernel read data the fakes
    lack (``retrying_with_shape_env``). Symbolic sizes trace under the Python dispatcher, as
    torch's AOT path does: torch's C++ reads some sizes as ints, a guard (``matmul`` of 4-d
    tensors) or a failure (sparse ``_embedding_bag_backward``: "Cannot call numel() on tensor
    with symbolic sizes")."""
    fake_mode = fake_mode_of(args)

    def trace(dispatcher: Callable[[], Any]) -> GraphModule:
        # A graph's no_grad region that raises midway would leave grad mode off for the caller.
        with in_fake_mode(fake_mode), dispatcher(), fresh_subgraph_caches(), region_schemas_remembered(), fx_traceback.preserve_node_meta(), torch.set_grad_enabled(torch.is_grad_enabled()):
            return make_fx(fn, decomposition_table=decompositions or {}, pre_dispatch=pre_dispatch,
                           record_module_stack=record_module_stack)(*args)

    if has_symbolic_sizes(list(args)):
        return retrying_with_shape_env(fake_mode, lambda: trace(python_dispatcher))
    return retrying_with_shape_env(fake_mode, lambda: trace(contextlib.nullcontext), lambda: trace(python_dispatcher))


def _record_constant_inputs(gm: GraphModule, args: Sequence[Any]) -> None:
    """Give each placeholder of a plain Python input (an exported model's ``use_cache=False``)
    its value as ``val``, as ``make_fx`` does for tensors and sizes, so a later re-trace has it."""
    for node, value in zip((n for n in gm.graph.nodes if n.op == "placeholder"), args):
        if "val" not in node.meta and (value is None or isinstance(value, (bool, int, float, str))):
            node.meta["val"] = value


def _drop_unused_effect_tokens(gm: GraphModule, n_args: int) -> None:
    """Call effectful ops directly instead of through the effect-token inputs tracing added.

    An effectful op (linalg's ``_linalg_check_errors``) makes ``FunctionalTensorMode`` add a
    token input that nobody passes (``tangents_token``) and wrap the call in ``with_effects``.
    The token only orders effects; graph order keeps that order, so the call runs as itself.
    """
    extra = [n for n in gm.graph.nodes if n.op == "placeholder"][n_args:]
    if not extra:
        return
    hop = getattr(torch.ops.higher_order, "with_effects", None)
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not hop:
            continue
        token, op, *op_args = node.args
        with gm.graph.inserting_before(node):
            direct = gm.graph.call_function(op, tuple(op_args), dict(node.kwargs))
        for user in list(node.users):
            index = user.args[1] if user.target is operator.getitem else None
            if index == 0:
                user.replace_all_uses_with(token)
            elif index == 1 and len(node.users) <= 2:
                user.replace_all_uses_with(direct)
            elif user.users:
                raise NotImplementedError(f"effectful op {op} with several results is not supported yet")
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
    for placeholder in extra:
        if placeholder.users:
            raise NotImplementedError(f"effect token {placeholder.name} is still read after unwrapping with_effects")
        gm.graph.erase_node(placeholder)
    gm.recompile()


def retrace(
    gm: GraphModule,
    *,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    functional: bool = True,
) -> GraphModule:
    """Re-trace ``gm`` on its own placeholder values, keeping placeholder names and node meta.

    Under ``functional`` the trace runs under the same functionalization as ``functionalize``,
    so decompositions that introduce in-place ops (common in backward formulas) stay functional.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    args = [n.meta["val"] for n in placeholders]
    names = [n.name for n in placeholders]
    pre_dispatch = keeps_grad_mode_regions(gm)

    def interpret(*flat_args: Any) -> Any:
        return LayoutKeepingInterpreter(gm).run(*flat_args)

    if functional:
        new_gm, mutations = functional_trace(
            interpret, args, pre_dispatch=pre_dispatch, decompositions=decompositions, arg_names=names
        )
        if mutations:
            raise RuntimeError(f"retrace found input mutations in a functional graph: {mutations}")
    else:
        new_gm = _traced(interpret, args, decompositions, pre_dispatch, record_module_stack=False)
        _rename_placeholders(new_gm, names, recompile=False)  # one recompile below, for both changes
        _record_constant_inputs(new_gm, args)
    _use_plain_codegen(new_gm)
    return new_gm


def nothing_to_decompose(
    gm: GraphModule, decompositions: dict[Any, Callable[..., Any]], _bodies: dict[int, bool] | None = None
) -> bool:
    """Whether re-tracing ``gm`` through ``decompositions`` would lower no op.

    True when every call is ``getitem``, an ATen-level op that is not in the table and that
    tracing does not break up by itself (no ``CompositeImplicitAutograd`` kernel), or an
    outlined region (``invoke_subgraph``) whose body holds only such calls: re-tracing would
    give the same graph back, and a graph of 48 region calls took most of a second to re-trace.
    Anything else (another higher-order op, a Python function, a submodule) counts as work.
    """
    bodies: dict[int, bool] = {} if _bodies is None else _bodies  # each shared body checked once
    region = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "get_attr" and isinstance(getattr(gm, str(node.target), None), GraphModule):
            continue  # a subgraph: the call that takes it decides
        if node.op != "call_function":
            return False
        target = node.target
        if target is operator.getitem:
            continue
        if region is not None and target is region:
            called = called_subgraphs(node)
            for body in called:
                if id(body) not in bodies:
                    bodies[id(body)] = nothing_to_decompose(body, decompositions, bodies)
            if called and all(bodies[id(body)] for body in called):
                continue
            return False
        if not isinstance(target, OpOverload) or target in decompositions:
            return False
        if torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd"):
            return False
    return True


def _rename_placeholders(gm: GraphModule, names: Sequence[str], *, recompile: bool = True) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, name in zip(placeholders, names):
        if node.name != name:
            node._rename(name)
            node.target = name
    if recompile:
        gm.recompile()


def _use_plain_codegen(gm: GraphModule) -> None:
    """Call graphs as ``gm(*flat_args) -> tuple``, whatever pytree structure tracing saw."""
    gm.graph._codegen = torch.fx.graph.CodeGen()
    gm.recompile()

def is_activation_checkpoint(target: Any) -> bool:
    """Whether an FX target is Dynamo's ``torch.utils.checkpoint`` region (a higher-order op)."""
    hop = getattr(torch.ops.higher_order, "tag_activation_checkpoint", None)
    return hop is not None and target is hop


def uses_functorch(gm: GraphModule) -> bool:
    """Whether the graph calls functorch transform plumbing (vmap/grad levels)."""
    for node in gm.graph.nodes:
        if node.op == "call_function":
            module = getattr(node.target, "__module__", "") or ""
            if module.startswith(("torch._functorch", "torch._C._functorch")):
                return True
    return False


def keeps_grad_mode_regions(gm: GraphModule) -> bool:
    """Whether re-tracing ``gm`` must happen pre-dispatch to keep its ``no_grad`` regions.

    Pre-dispatch tracing keeps ``_set_grad_enabled`` calls in the graph; it cannot enter
    functorch transforms, which post-dispatch tracing inlines into plain ATen ops instead.
    """
    grad_mode_calls = (n for n in gm.graph.nodes if n.op == "call_function" and n.target is set_grad_enabled)
    return any(grad_mode_calls) and not uses_functorch(gm)


def trace_graph(
    fn: Callable[..., Any],
    fake_args: Sequence[Any],
    *,
    pre_dispatch: bool,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    arg_names: Sequence[str] | None = None,
) -> GraphModule:
    """Trace ``fn`` as it is, mutations included; pre-dispatch keeps ``no_grad`` blocks."""
    gm = _traced(fn, fake_args, decompositions, pre_dispatch)
    if arg_names is not None:
        _rename_placeholders(gm, arg_names, recompile=False)  # one recompile below (codegen costs)
    _use_plain_codegen(gm)
    return gm


def holds_fake_constants(gm: GraphModule) -> bool:
    """Whether tracing lifted a fake tensor into ``gm`` as a constant: a value it lost track of.

    A pre-dispatch trace of ``torch.autograd.grad`` inside the function unpacks the saved
    output of ``exp`` as a new tensor the tracer never saw, and freezes its fake value.
    """
    return any(isinstance(value, FakeTensor) for value in gm.__dict__.values()) or any(
        isinstance(value, FakeTensor) for _, value in gm.named_buffers()
    )


@contextlib.contextmanager
def saved_tensors_hooks_deferred() -> Iterator[None]:
    """Keep the user's saved-tensor hooks (``save_on_cpu``, offloading) out of what is traced.

    They would run on fake tensors while a pass traces; as in torch's AOT, they run at runtime
    instead, around the compiled function's own saved tensors.
    """
    set_tracing = getattr(torch._C._autograd, "_saved_tensors_hooks_set_tracing", None)
    if set_tracing is None:  # a torch without the switch: nothing to defer
        yield
        return
    prior = set_tracing(True)
    try:
        yield
    finally:
        set_tracing(prior)
