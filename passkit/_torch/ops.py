"""Own what torch knows about ops and values: decomposition tables, Core ATen, autograd formulas,
random and data-dependent ops, and symbolic sizes.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket

from passkit._torch.hops import called_subgraphs
from passkit._torch.own_decomps import lowering_to_core, with_corrected_layouts

__all__ = [
    "attention_statistics_kept",
    "decomposition_may_decline",
    "AUTOGRAD_SEMANTIC_OPS",
    "concrete",
    "core_aten_table",
    "data_dependent_op",
    "decompositions_for",
    "call_draws_random_numbers",
    "draws_random_numbers",
    "is_impure",
    "full_table",
    "has_own_autograd_formula",
    "has_symbolic_sizes",
    "is_collective",
    "is_core_aten",
    "is_symbolic",
    "mkldnn_disabled",
    "no_fake_mode",
    "op_name",
    "size_hint",
    "specialize_float_inputs",
]


# -- decomposition tables -------------------------------------------------------------------


@functools.cache
def core_aten_table() -> dict[Any, Callable[..., Any]]:
    """torch's Core ATen decompositions, plus full-table ones for ops outside Core ATen.

    Functionalization emits ``*_functional`` variants (``_native_batch_norm_legit_functional``)
    that are not Core ATen and that torch's core table leaves alone; the full table lowers them.
    """
    import torch._decomp

    table = with_corrected_layouts(torch._decomp.core_aten_decompositions())
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


def is_impure(node: torch.fx.Node) -> bool:
    """FX's ``Node.is_impure``, and also a call of an op that returns nothing
    (``_linalg_check_errors``), which runs only for its effect.

    torch 2.13 knows such ops as effectful. torch 2.11 does not, and dead-code elimination
    dropped linalg's error check: ``linalg.inv`` of a singular matrix returned inf and NaN
    instead of raising, as eager does.
    """
    if node.op == "call_function" and isinstance(node.target, OpOverload) and not node.target._schema.returns:
        return True
    return node.is_impure()


def draws_random_numbers(op: Any) -> bool:
    """A random op (``bernoulli``, ``rrelu``, attention with dropout): tagged ``nondeterministic_seeded``."""
    return isinstance(op, OpOverload) and _tagged_seeded(op)


@functools.lru_cache(maxsize=None)
def _tagged_seeded(op: OpOverload) -> bool:
    # An op's tags never change, and reading them builds a list: the walks below ask once per
    # node of every body, for each of a region call's results.
    return torch.Tag.nondeterministic_seeded in op.tags


def call_draws_random_numbers(node: torch.fx.Node) -> bool:
    """Whether this call draws: a random op, unless its ``dropout_p`` is a literal zero.

    The fused attention ops are tagged random for their dropout; with ``dropout_p = 0`` (eval
    mode, ``p = 0``) their kernels draw nothing, so running them again gives the same result
    and leaves the generator where it was. A ``getitem`` of a random op's result counts as it,
    and a higher-order op draws when a subgraph it calls does.
    """
    target = node.args[0].target if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) else node.target
    call = node.args[0] if node.target is operator.getitem else node
    if isinstance(target, HigherOrderOperator):  # a cond branch or loop body that draws
        return any(_graph_draws(sub.graph) for sub in called_subgraphs(call))
    if not draws_random_numbers(target):
        return False
    names = [argument.name for argument in target._schema.arguments]
    if "dropout_p" not in names:
        return True
    index = names.index("dropout_p")
    p = call.args[index] if index < len(call.args) else call.kwargs.get("dropout_p", target._schema.arguments[index].default_value)
    return not (isinstance(p, (int, float)) and p == 0)


def _graph_draws(graph: torch.fx.Graph) -> bool:
    for inner in graph.nodes:
        target = inner.target
        if inner.op != "call_function" or (isinstance(target, OpOverload) and not _tagged_seeded(target)):
            continue  # most nodes of a body: an op that draws nothing, decided without the call below
        if call_draws_random_numbers(inner):
            return True
    return False


@functools.cache
def full_table() -> dict[Any, Callable[..., Any]]:
    """torch's full post-autograd decomposition table."""
    import torch._decomp

    return with_corrected_layouts(torch._decomp.decomposition_table)


def decompositions_for(ops: Sequence[Any]) -> dict[Any, Callable[..., Any]]:
    import torch._decomp

    own = lowering_to_core()
    found = with_corrected_layouts(torch._decomp.get_decompositions(list(ops)))
    return {**found, **{op: own[op] for op in ops if op in own}}

# Ops whose meaning is about autograd, not values: lowering them before ``joint`` (detach ->
# alias) would let gradients through.
AUTOGRAD_SEMANTIC_OPS = frozenset({torch.ops.aten.detach.default})


def is_core_aten(op: Any) -> bool:
    """In the Core ATen opset: tagged ``core``, or a prim."""
    return op.namespace == "prims" or torch.Tag.core in op.tags


# Functional collectives: communication, which no decomposition table lowers (DTensor's backward
# issues them inside ``joint``).
_COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional", "_c10d_functional_autograd"})


def is_collective(op: Any) -> bool:
    """A functional collective (``_c10d_functional.all_reduce``, ``wait_tensor``)."""
    return op.namespace in _COLLECTIVE_NAMESPACES


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
    if shape_env is not None and hasattr(shape_env, "optimization_hint"):
        # torch 2.13 deprecates ``size_hint`` (a FutureWarning on every unbacked size).
        return int(shape_env.optimization_hint(node.expr, fallback=_UNHINTED_SIZE))
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


def specialize_float_inputs(gm: torch.fx.GraphModule) -> int:
    """Read each Python float Dynamo passed as a tensor input as a constant, under a guard.

    Under ``dynamic=True`` Dynamo hands a float the model reads (``math.pi`` in a tanh GELU, a
    scale argument) to the backend as a 0-dim float64 input that the graph ``.item()``s into a
    symbolic float. torch's AOT Autograd turns such floats into tensor arithmetic
    (``tensorify_python_scalars``) and, where it cannot, has Dynamo specialize them; passkit
    does not run AOT's dispatch, and a symbolic float cannot be re-traced (``_local_scalar_dense``
    is data-dependent on fake tensors that lost Dynamo's memo), lowered by Inductor, or saved
    for the backward. So, as Dynamo does for floats it cannot tensorify, each ``.item()`` of such
    an input becomes the float's value, and ``guard_scalar`` makes Dynamo guard on that value:
    another value recompiles, it is never computed with the old one. The input stays, unused.
    Returns how many inputs were specialized.
    """
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.symbolic_shapes import guard_scalar

    specialized = 0
    for node in list(gm.graph.nodes):
        value = node.meta.get("example_value") if node.op == "placeholder" else None
        memo = getattr(value, "item_memo", None) if isinstance(value, FakeTensor) else None
        if memo is None or not node.users or not all(_reads_item(user) for user in node.users):
            continue
        constant = guard_scalar(memo)
        for user in list(node.users):
            for use in list(user.users):
                use.args = torch.fx.node.map_arg(use.args, lambda n: constant if n is user else n)
                use.kwargs = torch.fx.node.map_arg(use.kwargs, lambda n: constant if n is user else n)
            gm.graph.erase_node(user)
        specialized += 1
    if specialized:
        gm.recompile()
    return specialized


def _reads_item(node: torch.fx.Node) -> bool:
    return (node.op == "call_method" and node.target == "item") or (
        node.op == "call_function" and node.target is torch.ops.aten._local_scalar_dense.default
    )


def concrete(value: Any) -> Any:
    """The value a symbol stands for in this call (its hint), without adding a guard."""
    if is_symbolic(value):
        return value.node.hint
    return value

def op_name(target: Any) -> str | None:
    """``"aten.add.Tensor"`` for an ``OpOverload``, ``"aten.add"`` for a packet,
    ``"higher_order.cond"`` for a higher-order op; else None."""
    if isinstance(target, (OpOverload, OpOverloadPacket)):
        return str(target)
    if isinstance(target, HigherOrderOperator) and getattr(torch.ops.higher_order, target.name(), None) is target:
        return f"higher_order.{target.name()}"
    return None


# -- autograd formulas ----------------------------------------------------------------------


def has_own_autograd_formula(op: Any) -> bool:
    """Whether autograd differentiates ``op`` by its own formula rather than through its parts.

    Such an op must reach autograd whole: differentiating its decomposition instead can change
    the gradient (``special.log_ndtr``'s ``where`` branches give NaN where the formula does not).
    CompositeImplicitAutograd ops decompose above autograd in eager too.
    """
    if not isinstance(op, OpOverload):
        return False
    if op.namespace == "aten":  # registered once, when torch loads: asked per op of a table per compile
        return _aten_has_own_autograd_formula(op)
    return _has_own_autograd_formula(op.name())


@functools.cache
def _aten_has_own_autograd_formula(op: OpOverload) -> bool:
    return _has_own_autograd_formula(op.name())


def _has_own_autograd_formula(name: str) -> bool:
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


@functools.cache
def decomposition_may_decline(fn: Callable[..., Any]) -> bool:
    """Whether a decomposition can return ``NotImplemented`` (or raise ``NotImplementedError``),
    leaving its op in place: it names either in its own code or a function nested in it; true
    for callables without Python code.

    Reads the compiled code's names, not the source (``inspect.getsource`` tokenizes the file
    again for each entry, a tenth of a second over a table).
    """
    import inspect

    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return True
    pending = [code]
    while pending:
        current = pending.pop()
        if any("NotImplemented" in name for name in current.co_names):
            return True
        pending.extend(c for c in current.co_consts if isinstance(c, type(code)))
    return False


def attention_statistics_kept(gm: torch.fx.GraphModule) -> int:
    """Make every fused attention call in ``gm`` (and the bodies it calls) return the log-sum-exp
    its backward reads; returns how many calls changed.

    ``scaled_dot_product_attention`` picks its CUDA kernel when it is traced, and asks the
    efficient and cuDNN kernels (``compute_log_sumexp``) for the statistics only when an input
    requires grad. A forward traced before the joint, on values that do not, asks for none, and
    the backward of the joint then fails on the GPU ("LSE is not correctly aligned"), or Inductor
    cannot call the forward. torch's AOT path traces the joint at once, so it always asks.
    """
    changed = 0
    for module in gm.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        before = changed
        for node in module.graph.nodes:
            if node.op != "call_function" or not isinstance(node.target, OpOverload):
                continue
            names = [argument.name for argument in node.target._schema.arguments]
            if "compute_log_sumexp" not in names:
                continue
            index = names.index("compute_log_sumexp")
            if index < len(node.args):
                if node.args[index] is False:
                    node.args = (*node.args[:index], True, *node.args[index + 1:])
                    changed += 1
            elif node.kwargs.get("compute_log_sumexp") is False:
                node.kwargs = {**node.kwargs, "compute_log_sumexp": True}
                changed += 1
        if changed > before:
            module.recompile()
    return changed
