"""Own every use of torch's private internals, so that a torch upgrade touches one file.

Fake tensors, functional tracing (``make_fx`` under ``FunctionalTensorMode``), the
``torch._decomp`` tables and torch's min-cut partitioner are reached only through here.
Supported torch: 2.11 to 2.13.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.fx import GraphModule
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch._ops import OpOverload, OpOverloadPacket
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

# Grad mode as a plain call: what Dynamo and pre-dispatch graphs record for ``no_grad`` blocks.
set_grad_enabled = torch._C._set_grad_enabled

__all__ = [
    "FakeTensor",
    "OpOverload",
    "OpOverloadPacket",
    "pytree",
    "set_grad_enabled",
    "InputMutation",
    "StorageWeakRef",
    "core_aten_table",
    "decompositions_for",
    "fake_mode_of",
    "fakify",
    "full_table",
    "functional_trace",
    "min_cut_partition",
    "new_fake_mode",
    "retrace",
    "trace_graph",
    "is_activation_checkpoint",
    "keeps_grad_mode_regions",
    "has_mutations",
    "mutates",
    "AUTOGRAD_SEMANTIC_OPS",
    "is_core_aten",
    "size_hint",
    "static_input_specs",
    "graph_data",
    "graph_from_data",
    "fakes_with_shape_env",
    "inductor_config_digest",
    "inductor_cache_counts",
    "no_fake_mode",
    "propagate_fake_values",
]


def new_fake_mode() -> FakeTensorMode:
    return FakeTensorMode(allow_non_fake_inputs=True)


def fakify(mode: FakeTensorMode, value: Any) -> Any:
    """A fake twin of ``value`` (same shape, dtype, strides, requires_grad); non-tensors pass."""
    if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
        fake = mode.from_tensor(value, static_shapes=True)
        return fake
    return value


def fake_mode_of(values: Sequence[Any]) -> FakeTensorMode | None:
    for value in values:
        if isinstance(value, FakeTensor):
            return value.fake_mode
    return None


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
        keep_layout = contextlib.nullcontext() if pre_dispatch else _KeepRandomFillLayout()
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

    fake_mode = fake_mode_of(args)
    context = fake_mode if fake_mode is not None else contextlib.nullcontext()
    # A graph's no_grad region that raises midway would leave grad mode off for the caller.
    with context, fx_traceback.preserve_node_meta(), torch.set_grad_enabled(torch.is_grad_enabled()):
        gm = make_fx(
            functionalized,
            decomposition_table=decompositions or {},
            pre_dispatch=pre_dispatch,
            record_module_stack=True,
        )(*args)
    _drop_unused_effect_tokens(gm, len(args))
    if arg_names is not None:
        _rename_placeholders(gm, arg_names)
    return gm, list(mutations)


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
        fake_mode = fake_mode_of(args)
        context = fake_mode if fake_mode is not None else contextlib.nullcontext()
        with context, fx_traceback.preserve_node_meta():
            new_gm = make_fx(interpret, decomposition_table=decompositions or {}, pre_dispatch=pre_dispatch)(*args)
        _rename_placeholders(new_gm, names)
    _use_plain_codegen(new_gm)
    return new_gm


def _is_grad_mode_call(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and node.target is torch._C._set_grad_enabled


def _rename_placeholders(gm: GraphModule, names: Sequence[str]) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, name in zip(placeholders, names):
        if node.name != name:
            node._rename(name)
            node.target = name
    gm.recompile()


def _use_plain_codegen(gm: GraphModule) -> None:
    """Call graphs as ``gm(*flat_args) -> tuple``, whatever pytree structure tracing saw."""
    gm.graph._codegen = torch.fx.graph.CodeGen()
    gm.recompile()


# -- decomposition tables -------------------------------------------------------------------


@functools.cache
def core_aten_table() -> dict[Any, Callable[..., Any]]:
    """torch's Core ATen decompositions, plus full-table ones for ops outside Core ATen.

    Functionalization emits ``*_functional`` variants (``_native_batch_norm_legit_functional``)
    that are not Core ATen and that torch's core table leaves alone; the full table lowers them.
    """
    import torch._decomp

    table = dict(torch._decomp.core_aten_decompositions())
    for op, fn in torch._decomp.decomposition_table.items():
        name = getattr(op, "_opname", "")
        if op not in table and name.endswith("_functional") and torch.Tag.core not in op.tags:
            table[op] = fn
    # torch's table lowers empty_like to empty_permuted, which is not Core ATen and which no
    # torch table lowers further; empty_strided is.
    table.setdefault(torch.ops.aten.empty_permuted.default, _empty_permuted_as_strided)
    return table


def _empty_permuted_as_strided(size: Sequence[Any], physical_layout: Sequence[int], **factory_kwargs: Any) -> torch.Tensor:
    strides: list[Any] = [0] * len(size)
    running: Any = 1
    for dim in reversed(physical_layout):
        strides[dim] = running
        running = running * torch.sym_max(size[dim], 1)
    return torch.ops.aten.empty_strided.default(size, strides, **factory_kwargs)


def draws_random_numbers(op: Any) -> bool:
    """A random op (``bernoulli``, ``rrelu``, attention with dropout): tagged ``nondeterministic_seeded``."""
    return isinstance(op, OpOverload) and torch.Tag.nondeterministic_seeded in op.tags


@functools.cache
def full_table() -> dict[Any, Callable[..., Any]]:
    """torch's full post-autograd decomposition table."""
    import torch._decomp

    return dict(torch._decomp.decomposition_table)


def decompositions_for(ops: Sequence[Any]) -> dict[Any, Callable[..., Any]]:
    import torch._decomp

    return dict(torch._decomp.get_decompositions(list(ops)))


# -- partitioning ---------------------------------------------------------------------------


def min_cut_partition(
    joint: GraphModule, num_fwd_outputs: int, *, memory_budget: float = 1.0
) -> tuple[GraphModule, GraphModule]:
    """torch's min-cut rematerialization partitioner on a joint graph named primals_*/tangents_*."""
    import torch._functorch.config as functorch_config
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    with functorch_config.patch(activation_memory_budget=memory_budget):
        return min_cut_rematerialization_partition(
            joint, None, num_fwd_outputs=num_fwd_outputs, static_lifetime_input_indices=[]
        )


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
    return any(_is_grad_mode_call(n) for n in gm.graph.nodes) and not uses_functorch(gm)


def trace_graph(
    fn: Callable[..., Any],
    fake_args: Sequence[Any],
    *,
    pre_dispatch: bool,
    decompositions: dict[Any, Callable[..., Any]] | None = None,
    arg_names: Sequence[str] | None = None,
) -> GraphModule:
    """Trace ``fn`` as it is, mutations included; pre-dispatch keeps ``no_grad`` blocks."""
    fake_mode = fake_mode_of(fake_args)
    context = fake_mode if fake_mode is not None else contextlib.nullcontext()
    with context, fx_traceback.preserve_node_meta(), torch.set_grad_enabled(torch.is_grad_enabled()):
        gm = make_fx(
            fn, decomposition_table=decompositions or {}, pre_dispatch=pre_dispatch, record_module_stack=True
        )(*fake_args)
    if arg_names is not None:
        _rename_placeholders(gm, arg_names)
    _use_plain_codegen(gm)
    return gm


def mutates(node: torch.fx.Node) -> bool:
    """Whether ``node`` mutates an argument: an op with a mutable schema (in-place, out=), or a
    trailing-underscore tensor method."""
    if node.op == "call_method":
        return str(node.target).endswith("_")
    return node.op == "call_function" and isinstance(node.target, OpOverload) and node.target._schema.is_mutable


# Ops whose meaning is about autograd, not values: lowering them before ``joint`` (detach ->
# alias) would let gradients through.
AUTOGRAD_SEMANTIC_OPS = frozenset({torch.ops.aten.detach.default})


def is_core_aten(op: Any) -> bool:
    """In the Core ATen opset: tagged ``core``, or a prim."""
    return op.namespace == "prims" or torch.Tag.core in op.tags


def has_mutations(gm: GraphModule) -> bool:
    """Whether any node of ``gm`` mutates an argument (see ``mutates``)."""
    return any(mutates(n) for n in gm.graph.nodes)


# -- partition.min_cut: symbolic size hints and real tensors next to fake ones -------------------

# What torch's partitioner assumes for a size with no hint (an unbacked symbol).
_UNHINTED_SIZE = 8192


def size_hint(value: Any) -> int:
    """A concrete number for a (possibly symbolic) size: its hint, or a fixed guess if unbacked."""
    if isinstance(value, (int, float, bool)):
        return int(value)
    node = getattr(value, "node", None)
    hint = getattr(node, "hint", None)
    if hint is not None:
        return int(hint)
    shape_env = getattr(node, "shape_env", None)
    if shape_env is not None:
        try:
            return int(shape_env.size_hint(node.expr, allow_none=False))
        except Exception:  # unbacked: no hint exists
            pass
    return _UNHINTED_SIZE


def no_fake_mode() -> contextlib.AbstractContextManager[Any]:
    """Leave any active fake mode, so that real tensors are real (profiling ops)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


# -- layouts across decompositions ------------------------------------------------------------


def _prims_common() -> Any:
    import torch._prims_common as prims_common

    return prims_common


def _is_dense(value: torch.Tensor) -> bool:
    prims_common = _prims_common()
    check = getattr(prims_common, "is_non_overlapping_and_dense_or_false", None)
    if check is None:  # torch 2.11
        check = prims_common.is_non_overlapping_and_dense
    return bool(check(value))


def with_layout(value: Any, expected: Any) -> Any:
    """``value`` laid out like ``expected`` (same values), when the two differ and that is possible.

    A decomposition may return a tensor whose strides differ from those of the op it replaces:
    torch's own for the CPU flash attention lays its output out as (L, N, H, E) where the op
    returns ``empty_like(query)``. A graph traced before decomposing holds ``view`` nodes that
    are valid only for the op's own strides, so the decomposed value is re-laid out (permute,
    contiguous, permute back: Core ATen ops) to the strides the graph recorded.
    """
    if not isinstance(value, torch.Tensor) or not isinstance(expected, torch.Tensor):
        return value
    if value.dim() != expected.dim() or value.dim() < 2:
        return value
    prims_common = _prims_common()
    same, _ = prims_common.check_significant_strides(value, expected, only_cuda=False)
    if same or not _is_dense(expected):
        return value
    perm = prims_common.compute_elementwise_output_logical_to_physical_perm(expected)
    if isinstance(perm, tuple):  # (perm, ambiguous) since torch 2.6; a bare list before
        perm = perm[0]
    inverse = prims_common.invert_perm(perm)
    return value.permute(perm).contiguous().permute(inverse)


class LayoutKeepingInterpreter(torch.fx.Interpreter):
    """Run a graph whose nodes carry ``val`` and keep every value's strides as recorded.

    Used when re-tracing through decompositions: see ``with_layout``.
    """

    def run_node(self, n: torch.fx.Node) -> Any:
        value = super().run_node(n)
        if n.op == "call_function" and isinstance(value, torch.Tensor):
            return with_layout(value, n.meta.get("val"))
        return value


# -- symbolic sizes -----------------------------------------------------------------------------


def is_symbolic(value: Any) -> bool:
    """A ``SymInt``/``SymFloat``/``SymBool``: a size Dynamo left symbolic."""
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def has_symbolic_sizes(values: Sequence[Any]) -> bool:
    """Whether any value is a symbol, or a tensor with a symbolic size, stride or offset."""
    for value in values:
        if is_symbolic(value):
            return True
        if isinstance(value, torch.Tensor) and any(is_symbolic(d) for d in (*value.shape, *value.stride())):
            return True
    return False


def concrete(value: Any) -> Any:
    """The value a symbol stands for in this call (its hint), without adding a guard."""
    if is_symbolic(value):
        return value.node.hint
    return value

# -- pattern rewrites --------------------------------------------------------------------------


def propagate_fake_values(gm: GraphModule) -> str | None:
    """Re-derive every node's ``meta["val"]`` from the placeholders' fake values.

    Returns None, or the first line of the error a node raised (a ``view`` that the new
    strides do not allow, for example); then some nodes may hold new values, others old ones.
    """
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    values = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    mode = fake_mode_of(values)
    if mode is None:
        return "no fake values on the placeholders"
    try:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*values)
    except Exception as exc:  # the op's own error says what it could not take
        lines = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return None

# --- debugging (passkit.debug, passkit.instruments.repro, passkit.instruments.dumps) ---


def graph_codegen(graph: torch.fx.Graph) -> Any:
    """The graph's code generator (plain or pytree calling convention), to copy or serialise."""
    return graph._codegen


def op_name(target: Any) -> str | None:
    """``"aten.add.Tensor"`` for an ``OpOverload``, ``"aten.add"`` for a packet; else None."""
    if isinstance(target, (OpOverload, OpOverloadPacket)):
        return str(target)
    return None


def current_compile_id() -> str | None:
    """Dynamo's id of the graph being compiled (``"0/1"``: frame 0, its second compile), if any."""
    try:
        from torch._guards import CompileContext

        compile_id = CompileContext.current_compile_id()
    except Exception:  # outside Dynamo, or an API change: callers fall back to a counter
        return None
    return None if compile_id is None else str(compile_id)


def structured_trace_enabled() -> bool:
    """Whether torch's structured trace is on (``TORCH_TRACE`` set when torch was imported)."""
    from torch._logging._internal import trace_log

    return bool(trace_log.handlers)


def trace_artifact(name: str, payload: str, *, encoding: str = "string") -> None:
    """Emit one artifact into torch's structured trace (what ``tlparse`` renders), under the
    current Dynamo compile id when there is one."""
    from torch._logging import trace_structured

    trace_structured("artifact", metadata_fn=lambda: {"name": name, "encoding": encoding}, payload_fn=lambda: payload)

# -- Inductor -------------------------------------------------------------------------------


def inductor_mode_options(mode: str) -> dict[str, Any]:
    """The Inductor config that ``torch.compile(mode=...)`` applies for ``mode``."""
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode) or {})


def inductor_device_index() -> Any:
    """The box that a forward and its backward share to agree on a CUDA device (cudagraphs)."""
    from torch._inductor.cudagraph_utils import BoxedDeviceIndex

    return BoxedDeviceIndex(None)


def inductor_compile(
    gm: GraphModule,
    example_inputs: Sequence[Any],
    *,
    is_backward: bool,
    is_inference: bool,
    static_input_idxs: Sequence[int],
    user_visible_output_idxs: Sequence[int],
    config_patches: dict[str, Any],
    graph_id: int,
    device_index: Any,
) -> tuple[Callable[[list[Any]], Any], list[tuple[int, ...] | None] | None]:
    """Compile one functional ATen graph with Inductor's inner compiler (``compile_fx_inner``).

    ``gm`` is compiled in place (Inductor's post-grad passes rewrite it), so pass a copy. Returns
    the boxed callable (call it with a fresh list; it clears the list) and the strides Inductor
    chose for each output, which a backward compiled afterwards must be told about.
    """
    from torch._guards import TracingContext, tracing
    from torch._inductor import config as inductor_config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.utils import BoxedBool

    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    output.meta["user_visible_output_idxs"] = list(user_visible_output_idxs)
    fake_mode = fake_mode_of(example_inputs) or new_fake_mode()
    if fake_mode.shape_env is None:  # Inductor's FX graph cache bypasses graphs without one
        specs = static_input_specs(example_inputs)
        if specs is not None:
            example_inputs = fakes_with_shape_env(specs)
            fake_mode = fake_mode_of(example_inputs) or fake_mode
    # A context of our own: inside a Dynamo backend the ambient one carries Dynamo's fake mode.
    with inductor_config.patch(config_patches), tracing(TracingContext(fake_mode)):
        with TracingContext.report_output_strides() as strides:
            compiled = compile_fx_inner(
                gm,
                list(example_inputs),
                static_input_idxs=list(static_input_idxs),
                cudagraphs=BoxedBool(bool(inductor_config.triton.cudagraphs)),
                is_backward=is_backward,
                is_inference=is_inference,
                graph_id=graph_id,
                boxed_forward_device_index=device_index,
            )
    return compiled, (list(strides) if strides is not None else None)


def restride_fake(value: Any, stride: Sequence[int]) -> Any:
    """``value`` (a fake tensor) with the same size and offset and the given strides."""
    fake_mode = value.fake_mode
    with fake_mode:
        return torch.empty_strided(value.size(), tuple(stride), dtype=value.dtype, device=value.device)


@functools.cache
def inductor_all_decompositions() -> dict[Any, Callable[..., Any]]:
    """Inductor's whole decomposition table, as torch's AOT applies it before Inductor lowers."""
    from torch._inductor.decomposition import select_decomp_table

    return dict(select_decomp_table())


@functools.cache
def inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    """Inductor's table without the decompositions that may leave their op in place.

    Some decompositions apply only to some inputs and return ``NotImplemented`` otherwise (``mm``
    on tiny shapes, ``amax``, ``full`` with a dtype), for ops Inductor also lowers itself.
    Without them every op in the table is gone once it ran, which is what the ``decomposed``
    fact checks. Inductor lowers those ops itself; ``codegen.inductor`` gives ``full`` its dtype.
    """
    import inspect

    from torch._inductor.lowering import lowerings

    def may_decline(fn: Callable[..., Any]) -> bool:
        try:
            return "NotImplemented" in inspect.getsource(inspect.unwrap(fn))
        except (OSError, TypeError):
            return True

    return {op: fn for op, fn in inductor_all_decompositions().items() if not (op in lowerings and may_decline(fn))}


def inductor_callable(compiled: Any) -> Callable[[list[Any]], Any]:
    """The boxed function to call for a compiled graph: its generated code itself on the CPU.

    ``CompiledFxGraph.__call__`` enters autotune-cache and metrics contexts on every call, which
    only matter for GPU kernels; CPU-only graphs skip that per-call work.
    """
    direct = getattr(compiled, "current_callable", None)
    device_types = set(getattr(compiled, "device_types", ()) or ())
    if direct is not None and device_types <= {"cpu"}:
        return direct
    return compiled


# -- Inductor's FX graph cache (codegen.inductor's compile-cache form) -----------------------


def static_input_specs(values: Sequence[Any]) -> list[Any] | None:
    """Picklable descriptions of graph inputs: for a tensor ``(size, stride, storage_offset,
    dtype, device, requires_grad)``, any other value as it is; None when a size is symbolic."""
    specs: list[Any] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            if type(value) not in (FakeTensor, torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
                return None  # a subclass or another layout is more than its sizes and strides
            parts = [*value.shape, *value.stride(), value.storage_offset()]
            if any(isinstance(p, torch.SymInt) for p in parts):
                return None
            specs.append(("tensor", tuple(value.shape), tuple(value.stride()), int(value.storage_offset()),
                          value.dtype, value.device, bool(value.requires_grad)))
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
        else:
            specs.append(("value", value))
    return specs


def fakes_with_shape_env(specs: Sequence[Any]) -> list[Any]:
    """Fresh fake tensors for ``static_input_specs`` in a fake mode with a (static) shape
    environment, which Inductor's FX graph cache needs to key and look up a graph."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    values: list[Any] = []
    with mode:
        for spec in specs:
            if spec[0] != "tensor":
                values.append(spec[1])
                continue
            _, size, stride, offset, dtype, device, requires_grad = spec
            extent = offset + (1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0)
            value = torch.empty(max(extent, 1), dtype=dtype, device=device).as_strided(size, stride, offset)
            values.append(value.requires_grad_(requires_grad) if requires_grad else value)
    return values


_PLAIN = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


def _target_ref(target: Any) -> tuple[str, ...] | None:
    """``target`` by name: an ATen-style operator or a function found again by module and name."""
    import importlib

    if isinstance(target, str):
        return ("str", target)
    if isinstance(target, OpOverload):
        return ("op", target.namespace, target._opname, target._overloadname)
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except Exception:  # noqa: BLE001 - not importable by name: not storable
        return None
    return ("fn", module, name) if found is target else None


def _resolve_target(ref: Sequence[str]) -> Any:
    import importlib

    if ref[0] == "str":
        return ref[1]
    if ref[0] == "op":
        return getattr(getattr(getattr(torch.ops, ref[1]), ref[2]), ref[3])
    found: Any = importlib.import_module(ref[1])
    for part in ref[2].split("."):
        found = getattr(found, part)
    return found


class _NotStorable(Exception):
    pass


def _arg_data(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        return ("node", value.name)
    if isinstance(value, (list, tuple)):
        return ("list" if isinstance(value, list) else "tuple", [_arg_data(v) for v in value])
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return ("dict", [(k, _arg_data(v)) for k, v in value.items()])
    if isinstance(value, slice):
        return ("slice", [_arg_data(value.start), _arg_data(value.stop), _arg_data(value.step)])
    if isinstance(value, _PLAIN) or value is Ellipsis:
        return ("value", value)
    raise _NotStorable(type(value).__name__)


def _arg_value(data: Any, nodes: dict[str, torch.fx.Node]) -> Any:
    kind, body = data
    if kind == "node":
        return nodes[body]
    if kind in ("list", "tuple"):
        items = [_arg_value(v, nodes) for v in body]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _arg_value(v, nodes) for k, v in body}
    if kind == "slice":
        return slice(*(_arg_value(v, nodes) for v in body))
    if kind == "value":
        return body
    raise ValueError(f"unknown argument kind {kind!r}")


def graph_data(gm: GraphModule) -> dict[str, Any] | None:
    """``gm`` as plain picklable data that ``graph_from_data`` rebuilds with the same node names,
    targets and arguments (so the same code); None when it calls something not found by name,
    holds a submodule or an argument of another kind. Node metadata is not kept."""
    nodes, attrs = [], {}
    try:
        for node in gm.graph.nodes:
            target = _target_ref(node.target)
            if target is None or node.op == "call_module":
                return None
            if node.op == "get_attr":
                value = getattr(gm, node.target, None)
                if "." in node.target or not isinstance(value, torch.Tensor) or isinstance(value, FakeTensor):
                    return None
                attrs[node.target] = value.detach().clone()
            nodes.append((node.op, node.name, target, _arg_data(node.args), _arg_data(node.kwargs)))
    except _NotStorable:
        return None
    return {"nodes": nodes, "attrs": attrs}


def graph_from_data(data: dict[str, Any]) -> GraphModule:
    """The graph module ``graph_data`` described."""
    graph, made = torch.fx.Graph(), {}
    for op, name, target, args, kwargs in data["nodes"]:
        made[name] = graph.create_node(op, _resolve_target(target), _arg_value(args, made),
                                       _arg_value(kwargs, made), name=name)
    root = torch.nn.Module()
    for name, value in data["attrs"].items():
        setattr(root, name, value)
    return GraphModule(root, graph)


def _portable(value: Any) -> Any:
    """A config value as stable text: objects by ``uuid()`` or qualified name, never address."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_portable(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, dict):
        return {str(k): _portable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    uuid = getattr(value, "uuid", None)
    if callable(uuid):
        return ["uuid", str(uuid())]
    kind = value if isinstance(value, type) or callable(value) else type(value)
    return ["object", getattr(kind, "__module__", ""), getattr(kind, "__qualname__", repr(kind))]


def inductor_config_digest(config_patches: dict[str, Any]) -> str:
    """sha256 of Inductor's whole config (as FX graph cache keys see it) with ``config_patches``
    applied: what else, besides the graph, decides what Inductor generates."""
    import hashlib
    import json

    from torch._inductor import config as inductor_config

    with inductor_config.patch(config_patches):
        portable = _portable(inductor_config.save_config_portable())
    return hashlib.sha256(json.dumps(portable, sort_keys=True, default=repr).encode()).hexdigest()


def inductor_cache_counts() -> dict[str, int]:
    """This process's Inductor FX graph cache hits, misses and bypasses so far."""
    from torch._dynamo.utils import counters

    found = counters["inductor"]
    return {kind: int(found.get(f"fxgraph_cache_{kind}", 0)) for kind in ("hit", "miss", "bypass")}


# -- autograd formulas ----------------------------------------------------------------------


def has_own_autograd_formula(op: Any) -> bool:
    """Whether autograd differentiates ``op`` by its own formula rather than through its parts.

    Such an op must reach autograd whole: differentiating its decomposition instead can change
    the gradient (``special.log_ndtr``'s ``where`` branches give NaN where the formula does not).
    CompositeImplicitAutograd ops decompose above autograd in eager too.
    """
    if not isinstance(op, OpOverload):
        return False
    name = op.name()
    return torch._C._dispatch_has_kernel_for_dispatch_key(
        name, "Autograd"
    ) and not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeImplicitAutograd")


def data_dependent_op(exc: BaseException) -> str | None:
    """The op whose output shape or value depends on tensor data, if ``exc`` (or its cause) says so."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (DataDependentOutputException, DynamicOutputShapeException)):
            return str(exc.func) if getattr(exc, "func", None) is not None else str(exc)
        if "data is not allocated yet" in str(exc):
            return "an op that reads tensor data while tracing"
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


@contextlib.contextmanager
def mkldnn_disabled() -> Any:
    """oneDNN off while tracing (``torch.backends.mkldnn.flags`` also sets TF32 and warns)."""
    previous = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        yield
    finally:
        torch._C._set_mkldnn_enabled(previous)


# -- random ops that fill a strided tensor in place ------------------------------------------


@torch.library.custom_op(
    "passkit::bernoulli_in_layout", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def _bernoulli_in_layout(self: torch.Tensor, p: float) -> torch.Tensor:
    return torch.empty_strided(self.size(), self.stride(), dtype=self.dtype, device=self.device).bernoulli_(p)


@_bernoulli_in_layout.register_fake
def _(self: torch.Tensor, p: float) -> torch.Tensor:
    return torch.empty_strided(self.size(), self.stride(), dtype=self.dtype, device=self.device)


BERNOULLI_IN_LAYOUT = torch.ops.passkit.bernoulli_in_layout.default


class _KeepRandomFillLayout(TorchDispatchMode):
    """Functionalize ``t.bernoulli_(p)`` on a non-contiguous ``t`` without changing its draws.

    Its functional form ``bernoulli.p`` fills a new contiguous tensor, in logical order; the
    in-place op on ``t`` fills ``t``'s own layout, in memory order on some CPUs (eager dropout
    draws into ``empty_like`` of a transposed activation). ``passkit::bernoulli_in_layout``
    runs the in-place op on a fresh tensor of ``t``'s strides, so it draws what eager draws.
    The other in-place random ops' functional forms clone ``t`` and keep its layout already.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.bernoulli_.float and kwargs.get("generator") is None:
            target = args[0]
            if target.layout == torch.strided and not target.is_contiguous():
                p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
                return target.copy_(BERNOULLI_IN_LAYOUT(target, p))
        return func(*args, **kwargs)


def holds_fake_constants(gm: GraphModule) -> bool:
    """Whether tracing lifted a fake tensor into ``gm`` as a constant: a value it lost track of.

    A pre-dispatch trace of ``torch.autograd.grad`` inside the function unpacks the saved
    output of ``exp`` as a new tensor the tracer never saw, and freezes its fake value.
    """
    return any(isinstance(value, FakeTensor) for value in gm.__dict__.values()) or any(
        isinstance(value, FakeTensor) for _, value in gm.named_buffers()
    )


def is_multi_output_view(value: Any) -> bool:
    """Whether autograd made ``value`` as one of several views (``unbind``, ``split``)."""
    if not isinstance(value, torch.Tensor) or not value._is_view():
        return False
    return torch._C._autograd._get_creation_meta(value) == torch._C._autograd.CreationMeta.MULTI_OUTPUT_NODE


# --- reinplacing (the ``reinplace`` pass) -------------------------------------------------------


def reinplace_graph(gm: torch.fx.GraphModule, sample_args: Sequence[Any]) -> None:
    """Run torch's functional-to-in-place pass (``torch.fx.passes.reinplace``) on ``gm``.

    It turns ``b = op(a)`` into ``a.op_()`` where neither ``a`` nor any alias of it is read
    later, is a graph input or is returned, and removes ``{view}_scatter`` ops the same way.
    ``sample_args`` may be fake tensors of another mode; the pass re-derives metadata on its own
    fake mode and leaves it in ``meta`` under ``fake_result``, ``node_idx`` and ``view_of``,
    which are dropped here.
    """
    from torch.fx.passes.reinplace import reinplace

    reinplace(gm, *sample_args)
    for node in gm.graph.nodes:
        for key in ("fake_result", "node_idx", "view_of"):
            node.meta.pop(key, None)
