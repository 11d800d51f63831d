"""Own what passkit knows about higher-order ops (``cond``, ``while_loop``, ``flex_attention``,
``invoke_subgraph``, ``auto_functionalized``): their subgraphs, and how passkit's own tracing
treats them.

A higher-order op takes its subgraphs as ``get_attr`` submodules of the graph that calls it.
Passkit's dispatch modes forward these ops with the mode back on around each subgraph
(``forward_hop``), each trace gets its own ``invoke_subgraph`` caches, and graph walkers find the
subgraphs a graph calls with ``subgraphs``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.fx
from torch._ops import HigherOrderOperator
from torch.fx import GraphModule
from torch.fx import traceback as fx_traceback
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from passkit._torch.unbacked import asks_for_unbacked_sizes, makes_unbacked_sizes

__all__ = [
    "HigherOrderOperator",
    "asks_for_shape_env",
    "builds_nested",
    "called_subgraphs",
    "calls_higher_order",
    "call_keeping_whole",
    "forward_hop",
    "fresh_subgraph_caches",
    "graph_and_subgraphs",
    "is_higher_order",
    "higher_order_ops_on_real_tensors",
    "loop_backwards_traceable",
    "needs_shape_env",
    "subgraph_grads_by_running",
    "subgraphs",
    "subgraphs_traced_in",
]

# Higher-order ops whose fake rule draws fresh (unbacked) symbols, so it asserts a ShapeEnv.
_NEEDS_SHAPE_ENV = ("while_loop", "while_loop_stack_output")


# Higher-order ops whose autograd rule traces them as another op (``while_loop`` as
# ``while_loop_stack_output``, which keeps every iteration for the backward).
_AUTOGRAD_RULE_REWRITES = ("while_loop",)


def call_keeping_whole(target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Call an FX target in a trace that records a forward only (``functionalize``, ``decompose``).

    A higher-order op whose autograd rule would rewrite it runs below autograd, so the graph
    keeps the op the user wrote and ``joint`` differentiates it; other targets run as they are.
    """
    if isinstance(target, HigherOrderOperator) and target.__name__ in _AUTOGRAD_RULE_REWRITES:
        with torch._C._AutoDispatchBelowAutograd():
            return target(*args, **kwargs)
    return target(*args, **kwargs)


def is_higher_order(target: Any) -> bool:
    """Whether an FX call target is a higher-order op (it may take subgraphs)."""
    return isinstance(target, HigherOrderOperator)


def subgraphs(gm: GraphModule) -> dict[str, GraphModule]:
    """The subgraphs ``gm`` reads with ``get_attr`` (a higher-order op's branches, bodies, score
    functions), by attribute name; not those of the subgraphs themselves."""
    found: dict[str, GraphModule] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = _attribute(gm, str(node.target))
            if isinstance(value, GraphModule):
                found[str(node.target)] = value
    return found


def graph_and_subgraphs(gm: GraphModule) -> list[GraphModule]:
    """``gm`` and every subgraph it calls at any depth, each once (graphs may share one)."""
    found: dict[int, GraphModule] = {id(gm): gm}
    stack = [gm]
    while stack:
        for sub in subgraphs(stack.pop()).values():
            if id(sub) not in found:
                found[id(sub)] = sub
                stack.append(sub)
    return list(found.values())


def called_subgraphs(node: torch.fx.Node) -> list[GraphModule]:
    """The subgraphs a higher-order op node takes (through ``get_attr`` arguments), at any depth."""
    if node.op != "call_function" or not is_higher_order(node.target):
        return []
    root = node.graph.owning_module
    direct = [
        value
        for arg in pytree.tree_leaves((node.args, node.kwargs))
        if isinstance(arg, torch.fx.Node) and arg.op == "get_attr"
        for value in [_attribute(root, str(arg.target)) if root is not None else None]
        if isinstance(value, GraphModule)
    ]
    found: dict[int, GraphModule] = {}
    for sub in direct:
        for inner in graph_and_subgraphs(sub):
            found.setdefault(id(inner), inner)
    return list(found.values())


def _attribute(gm: torch.nn.Module, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def forward_hop(mode: TorchDispatchMode, hop: HigherOrderOperator, args: Any, kwargs: dict[str, Any]) -> Any:
    """Run ``hop`` below ``mode`` (its own rules apply, functionalization and tracing), with
    ``mode`` back on around each of its subgraphs, which so trace as the graph around them."""

    def under_mode(value: GraphModule) -> Callable[..., Any]:
        run = _run_keeping_node_meta(value)

        def subgraph(*sub_args: Any) -> Any:
            with mode:
                return run(*sub_args)

        subgraph.__wrapped__ = value  # type: ignore[attr-defined]  # the body, for _torch.regions
        return subgraph

    args, kwargs = pytree.tree_map_only(GraphModule, under_mode, (tuple(args), kwargs))
    return hop(*args, **kwargs)


def _run_keeping_node_meta(gm: GraphModule) -> Callable[..., Any]:
    """``gm`` as a function that keeps its nodes' stack traces in what traces it (as torch's
    ``_maybe_run_with_interpreter`` does for the subgraphs of its own higher-order ops)."""
    if not fx_traceback.has_preserved_node_meta():
        return gm

    def interpreted(*args: Any) -> Any:
        with fx_traceback.preserve_node_meta():
            return torch.fx.Interpreter(gm).run(*args)

    return interpreted


@contextlib.contextmanager
def fresh_subgraph_caches() -> Iterator[None]:
    """One trace's own caches of traced ``invoke_subgraph`` bodies, keyed by their identifier.

    Dynamo's tracing context, active while a backend compiles, keeps them for the whole compile;
    passkit traces the same subgraph several times (functionalize, decompose, joint), and a body
    or autograd rule cached by an earlier trace would be reused as it was then: undecomposed, or
    with the gradient plan of another trace.
    """
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    if context is None or not hasattr(context, "hop_dispatch_set_cache"):
        yield
        return
    prior = context.hop_dispatch_set_cache
    context.hop_dispatch_set_cache = type(prior)()
    try:
        yield
    finally:
        context.hop_dispatch_set_cache = prior


@contextlib.contextmanager
def subgraphs_traced_in(fake_mode: Any) -> Iterator[None]:
    """The fake mode (or ``None``: real tensors) in which a higher-order op's autograd rule
    traces the subgraphs it builds (``while_loop``'s backward body, through ``detect_fake_mode``).

    Dynamo's tracing context, active while a backend compiles, names Dynamo's fake mode, and
    torch prefers it to the tensors' own: the backward would be traced against Dynamo's shape
    environment, which lacks the sizes passkit's trace drew (``KeyError: u2``), or traced on
    real tensors as if they were fake (``_local_scalar_dense`` of a tracing tensor).
    """
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    if context is None or context.fake_mode is fake_mode:
        yield
        return
    prior = context.fake_mode
    context.fake_mode = fake_mode
    try:
        yield
    finally:
        context.fake_mode = prior


def higher_order_ops_on_real_tensors(graphs: Any) -> contextlib.AbstractContextManager[None]:
    """Around running ``graphs`` under autograd on real tensors while a backend compiles.

    Dynamo's tracing context names Dynamo's fake mode, and torch traces a higher-order op's
    subgraphs in it (``subgraphs_traced_in``), real operands included: "Please convert all
    Tensors to FakeTensors" (torch 2.11's ``cond`` and ``invoke_subgraph`` even without grad).
    ``while_loop``'s backward and ``cond`` then trace in a fake mode of their own, made where
    torch finds none. ``invoke_subgraph``'s backward needs a fake mode, so it gets one that takes
    the real operands.
    """
    if any(calls_higher_order(gm, op) for gm in graphs for op in ("while_loop", "cond")):
        return subgraphs_traced_in(None)
    if any(calls_higher_order(gm, "invoke_subgraph") for gm in graphs):
        from torch._subclasses.fake_tensor import FakeTensorMode

        return subgraphs_traced_in(FakeTensorMode(allow_non_fake_inputs=True))
    return contextlib.nullcontext()


@contextlib.contextmanager
def subgraph_grads_by_running(gm: GraphModule) -> Iterator[None]:
    """While differentiating ``gm``, ``invoke_subgraph`` finds out which of its subgraph's
    outputs need grad by running the subgraph, not from the outputs' recorded values.

    Its autograd rule reads ``requires_grad`` off the values the subgraph's output node
    records. Those come from Dynamo's trace; passkit's functional trace records the values below
    autograd, where nothing requires grad, and the rule would then drop every tangent.
    """
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    hidden: list[tuple[torch.fx.Node, Any]] = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not hop or not isinstance(node.args[0], torch.fx.Node):
            continue
        body = _attribute(gm, str(node.args[0].target))
        if not isinstance(body, GraphModule):
            continue
        output = next(n for n in reversed(body.graph.nodes) if n.op == "output")
        for value in pytree.tree_leaves(output.args):
            if isinstance(value, torch.fx.Node) and "val" in value.meta:
                hidden.append((value, value.meta.pop("val")))
    try:
        yield
    finally:
        for value, val in hidden:
            value.meta["val"] = val


@contextlib.contextmanager
def loop_backwards_traceable(gm: GraphModule, values: Any) -> Iterator[None]:
    """While differentiating ``gm`` on fake ``values``, ``while_loop``'s backward may read its
    iteration index as a number (``.item()``, to select that iteration's saved carries).

    Dynamo's fake mode refuses scalar outputs unless ``capture_scalar_outputs`` is set, so with
    ``dynamic=True`` torch's own AOT fails there; the number lives inside the backward's body
    only, so passkit allows it for this trace.
    """
    fake_mode = next((v.fake_mode for v in pytree.tree_leaves(values) if hasattr(v, "fake_mode")), None)
    if fake_mode is None or getattr(fake_mode, "allow_scalar_outputs", True) or not calls_higher_order(gm, "while_loop"):
        yield
        return
    fake_mode.allow_scalar_outputs = True
    try:
        yield
    finally:
        fake_mode.allow_scalar_outputs = False


def calls_higher_order(gm: GraphModule, *names: str) -> bool:
    """Whether ``gm`` or any subgraph in it calls one of the named higher-order ops."""
    hops = {getattr(torch.ops.higher_order, name, None) for name in names} - {None}
    return any(
        node.op == "call_function" and node.target in hops
        for module in gm.modules()
        if isinstance(module, GraphModule)
        for node in module.graph.nodes
    )


def asks_for_shape_env(exc: BaseException) -> bool:
    """Whether tracing failed for want of a ShapeEnv: a higher-order op's fake rule (``while_loop``)
    or a data-dependent op's (``nonzero``, ``.item()``) met passkit's static fake mode, which has none."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 8:
        text = str(current)
        if "Must provide a fake_mode with shape_env" in text or "no attribute 'ignore_fresh_unbacked_symbols'" in text:
            return True
        current, seen = current.__cause__ or current.__context__, seen + 1
    return asks_for_unbacked_sizes(exc)


# Functions that build a jagged NestedTensor: its ragged size is a nested int, which a fake mode
# draws from its ShapeEnv ("self.shape_env must not be None" without one).
_BUILDS_NESTED = (
    torch.nested.nested_tensor,
    torch.nested.as_nested_tensor,
    torch.nested.nested_tensor_from_jagged,
    torch.nested.narrow,
)


def builds_nested(gm: GraphModule) -> bool:
    """Whether ``gm`` (at any depth of subgraphs) builds a jagged NestedTensor itself."""
    return any(
        node.op == "call_function" and node.target in _BUILDS_NESTED
        for module in gm.modules()
        if isinstance(module, GraphModule)
        for node in module.graph.nodes
    )


def needs_shape_env(gm: GraphModule) -> bool:
    """Whether tracing ``gm`` needs a fake mode with a ShapeEnv, at any depth of subgraphs: a
    ``while_loop``, a jagged NestedTensor built inside, or an op whose size or value the data decides."""
    return calls_higher_order(gm, *_NEEDS_SHAPE_ENV) or builds_nested(gm) or makes_unbacked_sizes(gm)

