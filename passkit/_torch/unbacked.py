"""Own data-dependent sizes: which graphs make unbacked symbols (``nonzero``, ``masked_select``,
``unique``, ``.item()``), which tracing failures ask for the shape environment that carries
them or for torch's Python kernels that read data through ``.item()``, and the range
constraints an exported graph's symbols need.

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
           "range_constraints_of", "retrying_with_shape_env"]

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


def _graph_values(gm: GraphModule) -> list[Any]:
    return [
        node.meta["val"]
        for module in gm.modules()
        if isinstance(module, GraphModule)
        for node in module.graph.nodes
        if node.meta.get("val") is not None
    ]


def _unbacked_symbols_of(values: list[Any]) -> list[Any]:
    found: dict[Any, None] = {}
    for value in values:
        try:
            found.update(dict.fromkeys(free_unbacked_symbols(value)))
        except Exception:  # noqa: BLE001 - a value symbolic_shapes cannot walk holds none
            continue
    return list(found)


def _shape_env_of(values: list[Any]) -> Any:
    for value in values:
        if isinstance(value, torch.Tensor) and getattr(value, "fake_mode", None) is not None:
            return value.fake_mode.shape_env
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return value.node.shape_env
    return None


def range_constraints_of(gm: GraphModule, captured: dict[Any, Any]) -> dict[Any, Any]:
    """The range constraints of an exported graph that passkit traced again: ``captured``'s
    (those ``torch.export`` recorded) for the symbols the graph still holds, and for each
    unbacked symbol the new trace drew (``u2`` where the capture had ``u0``: each trace of
    ``.item()`` or ``nonzero`` draws a fresh one) its range in the shape environment, as
    ``run_decompositions`` takes them. ``torch.export.load`` rebuilds its shape environment
    from these alone, and fails on a symbol they lack."""
    values = _graph_values(gm)
    shape_env = _shape_env_of(values)
    if shape_env is None:
        return dict(captured)
    unbacked = _unbacked_symbols_of(values)
    replaced = getattr(shape_env, "replacements", {})
    kept = {
        symbol: bounds
        for symbol, bounds in captured.items()
        if symbol not in replaced and (symbol in unbacked or not free_unbacked_symbols(symbol))
    }
    for symbol in unbacked:
        if symbol not in kept and symbol in shape_env.var_to_range:
            kept[symbol] = shape_env.var_to_range[symbol]
    return kept


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


def _reads_fake_data(exc: BaseException) -> bool:
    """Whether a trace failed because a kernel read a fake tensor's data: a data-dependent op
    without a shape environment, or a C++ composite kernel that reads its argument's elements
    (``tensor_split`` with a tensor of split points)."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        if "data is not allocated yet" in str(current):
            return True
        current, seen = current.__cause__ or current.__context__, seen + 1
    return asks_for_unbacked_sizes(exc)


def retrying_with_shape_env(fake_mode: Any, trace: Callable[[], T], with_python_kernels: Callable[[], T] | None = None) -> T:
    """``trace()``; when it failed reading tensor data, once more with a shape environment given
    to ``fake_mode`` if it had none, and then ``with_python_kernels()``: the trace under torch's
    Python dispatcher, whose Python kernels of composite ops (``istft``, ``tensor_split`` with a
    tensor of split points) read data through ``.item()`` as unbacked symbols where their C++
    kernels read elements a fake tensor does not have. ``torch.export`` always traces under it."""
    try:
        return trace()
    except Exception as exc:
        if not _reads_fake_data(exc):
            raise
        if not give_shape_env(fake_mode):
            if with_python_kernels is None:
                raise
            return with_python_kernels()
    if with_python_kernels is None:
        return trace()
    try:
        return trace()
    except Exception as exc:
        if not _reads_fake_data(exc):
            raise
    return with_python_kernels()


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
