"""Own data-dependent sizes: which graphs make unbacked symbols (``nonzero``, ``masked_select``,
``unique``, ``.item()``), and which tracing failures ask for the shape environment that carries
them.

A graph that makes one is traced in a fake mode with a ``ShapeEnv``, as torch's AOT path traces
it: the op's fake rule draws a fresh unbacked symbol for the size or value, ``make_fx`` records
where it is bound (``unbacked_bindings``) and keeps the run-time checks torch asserts on it
(``_assert_scalar``, ``sym_constrain_range_for_size``) in the graph.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import torch
from torch.fx import GraphModule
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

T = TypeVar("T")

__all__ = ["asks_for_unbacked_sizes", "data_dependent_guard", "forget_pending_unbacked", "give_shape_env", "is_runtime_assert", "makes_unbacked_sizes",
           "retrying_with_shape_env"]

# Tensor methods and torch functions Dynamo records whose result size or value is data's.
_DATA_DEPENDENT_NAMES = frozenset(
    {"nonzero", "masked_select", "unique", "unique_consecutive", "item", "tolist", "argwhere", "_local_scalar_dense"}
)


def _recorded_value(node: torch.fx.Node) -> Any:
    return node.meta.get("val", node.meta.get("example_value"))


def _makes_unbacked(node: torch.fx.Node) -> bool:
    if node.op not in ("call_function", "call_method"):
        return False
    value = _recorded_value(node)
    if value is not None:
        try:
            if free_unbacked_symbols(value):
                return True
        except Exception:  # noqa: BLE001 - a value symbolic_shapes cannot walk makes none
            pass
    target = node.target
    if isinstance(target, str):
        return target in _DATA_DEPENDENT_NAMES
    if isinstance(target, torch._ops.OpOverload):
        tags = set(target.tags)
        return torch.Tag.dynamic_output_shape in tags or torch.Tag.data_dependent_output in tags
    return getattr(target, "__name__", None) in _DATA_DEPENDENT_NAMES


def makes_unbacked_sizes(gm: GraphModule) -> bool:
    """Whether ``gm`` (or a subgraph of it) makes a size or number only the data decides."""
    return any(
        _makes_unbacked(node)
        for module in gm.modules()
        if isinstance(module, GraphModule)
        for node in module.graph.nodes
    )


def asks_for_unbacked_sizes(exc: BaseException) -> bool:
    """Whether tracing on fakes without a shape environment failed at a data-dependent op."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, (DataDependentOutputException, DynamicOutputShapeException)):
            return True
        current, seen = current.__cause__ or current.__context__, seen + 1
    return False


def forget_pending_unbacked(fake_mode: Any) -> None:
    """Drop the unbacked symbols earlier fake runs drew and no trace bound (a run that learns
    output shapes, a tangent's example): a new trace would take them for its own and fail at its
    first node with ``PendingUnbackedSymbolNotFound``. torch's AOT path ignores them the same
    way (``ignore_fresh_unbacked_symbols`` around its fake runs)."""
    shape_env = getattr(fake_mode, "shape_env", None)
    pending = getattr(shape_env, "pending_fresh_unbacked_symbols", None)
    if pending:
        pending.clear()


def give_shape_env(fake_mode: Any) -> bool:
    """Give a static fake mode the shape environment a data-dependent op asked for; whether it
    had none. Its fake tensors keep their static sizes (``static_shapes`` stays on); only the
    op's fresh unbacked symbols live there. A program captured static (``aot_function``) meets
    such an op only when a later step lowers or differentiates an op whose decomposition or
    backward formula makes one (``index_put`` through a boolean mask: its backward calls
    ``nonzero``)."""
    if fake_mode is None or getattr(fake_mode, "shape_env", None) is not None:
        return False
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fake_mode.shape_env = ShapeEnv()
    fake_mode.static_shapes = True
    return True


def retrying_with_shape_env(fake_mode: Any, trace: Callable[[], T]) -> T:
    """``trace()``, once more with a shape environment given to ``fake_mode`` when it failed at a
    data-dependent op for want of one."""
    try:
        return trace()
    except Exception as exc:
        if not asks_for_unbacked_sizes(exc) or not give_shape_env(fake_mode):
            raise
    return trace()


def data_dependent_guard(exc: BaseException) -> str | None:
    """The expression a trace had to decide on a value only the data knows (Python's ``if`` on
    ``x.sum().item()``), if ``exc`` (or its cause) says so."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if isinstance(current, GuardOnDataDependentSymNode):
            cond = getattr(current, "cond", None)
            return str(cond) if cond is not None else "a data-dependent expression"
        current, seen = current.__cause__ or current.__context__, seen + 1
    return None


def is_runtime_assert(op: Any) -> bool:
    """A check tracing adds on an unbacked symbol (``u0 >= 0``, ``u0 <= 32``) or on a tensor's
    metadata, which the program keeps and runs: no table lowers it, and it is in every opset as
    torch's export keeps it in Core ATen programs."""
    return op in _RUNTIME_ASSERTS


# ``_assert_tensor_metadata`` is torch.export's check of a ``.to()``'s input (Hugging Face GPT-2
# has it): its Core ATen programs keep it, and a program passkit.export made holds it.
_RUNTIME_ASSERTS = frozenset(
    getattr(torch.ops.aten, name).default
    for name in ("_assert_scalar", "sym_constrain_range", "sym_constrain_range_for_size", "_assert_async",
                 "_assert_tensor_metadata")
    if hasattr(torch.ops.aten, name)
)
