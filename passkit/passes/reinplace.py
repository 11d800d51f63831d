"""Own ``reinplace``: turn functional ops back into in-place ones where nothing else reads the input.

A post-grad pass: it runs on ``forward`` and ``backward`` after partitioning (or on an
inference program's ``main``), after every pass that needs functional graphs and before
code generation. ``b = add(a, c)`` becomes ``a.add_(c)`` (and later readers of ``b`` read
``a``) when ``a`` and every alias of it is read by nothing after the op, is not a graph input
(parameters, user inputs, saved values and tangents the backward receives are all inputs), and
is not returned (user outputs, saved values). A ``{view}_scatter`` whose base dies with it
becomes a copy into a view of that base. Each such op allocates nothing, so allocator traffic
falls, and the peak too where a chain of such ops is the peak; values are bitwise the same.

The analysis is torch's own (``torch.fx.passes.reinplace``, through ``passkit._torch``). passkit
adds two guards that torch's pass does not make, so that no later op sees a tensor other than
the one its metadata describes and no numerics change:

- an op whose input has another shape, stride or storage offset than its result stays
  functional (an in-place op keeps its input's layout, and torch only compares element counts);
- random ops stay functional (an in-place draw need not consume the generator the same way).

Each conversion is one application that ``passkit_should_apply`` may refuse (kind
``"reinplace"``, named by the op and what it becomes, ``"aten.add.Tensor -> aten.add_.Tensor"``,
or ``"... -> copy_"`` for a scatter; its node's name), asked in graph order, so ``passkit
bisect`` can narrow a bad reinplace to one node. A refused op stays functional.

The graphs stop being ``functional`` (the pass invalidates that fact), so ``validate`` rejects
a pipeline that puts a step needing it (``joint``, ``decompose``, ``rewrite``) after this one.

Use it with ``codegen.python`` or another code generator that runs each graph op as one ATen
call. Before ``codegen.inductor`` it works (a GELU MLP trains to the same results) but is not
expected to help, and was not measured: Inductor reuses dying buffers itself (its
``inplace_buffers`` and ``allow_buffer_reuse`` options). The report row gives ``reinplaced``
(ops made in-place), ``scatters_removed`` and ``bytes_not_allocated`` (the sum of their result
sizes), and ``skipped`` graphs with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.errors import PassError
from passkit.core.failed_node import source_line
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext

__all__ = ["reinplace"]

# Whether a node may become in-place: (node, what it becomes, "inplace" or "scatter") -> allowed.
Ask = Callable[[Node, Any, str], bool]


def _layout(value: Any) -> tuple[Any, ...] | None:
    if not isinstance(value, torch.Tensor):
        return None
    # The offset too: a later as_strided addresses the storage from the offset its input had.
    return (tuple(value.shape), tuple(value.stride()), value.storage_offset(), value.dtype)


def _must_stay_functional(node: Node) -> bool:
    target = node.target
    if not isinstance(target, _torch.OpOverload):
        return False
    if _torch.call_draws_random_numbers(node):
        return True
    first = node.args[0] if node.args else None
    if not isinstance(first, Node):
        return True  # a Python number where the schema says Tensor: nothing to reuse (and torch's pass trips)
    mine = _layout(node.meta.get("val"))
    return mine is None or mine != _layout(first.meta.get("val"))


_COMMUTATIVE = (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)


def _rooted_in_input(node: Node) -> bool:
    while node.op == "call_function" and isinstance(node.target, _torch.OpOverload) and node.target.is_view:
        if not node.args or not isinstance(node.args[0], Node):
            return False
        node = node.args[0]
    return node.op == "placeholder"


def _read_later(node: Node, here: Node, order: dict[Node, int]) -> bool:
    return any(order[user] > order[here] for user in node.users)


def _cannot_take_result(operand: Any, node: Node, order: dict[Node, int]) -> bool:
    """Cheap reasons why ``operand`` cannot hold ``node``'s result in place."""
    return (
        not isinstance(operand, Node)
        or _rooted_in_input(operand)
        or _read_later(operand, node, order)
        or _layout(operand.meta.get("val")) != _layout(node.meta.get("val"))
    )


def _put_dying_operand_first(gm: GraphModule) -> list[Node]:
    """``add(x, t)`` / ``mul(x, t)`` where only ``t`` can be overwritten become ``add(t, x)``:
    torch's pass only ever reuses the first operand. IEEE addition and multiplication are
    commutative, so values are bitwise the same; ``alpha`` must be 1. Returns the swapped nodes."""
    order = {node: index for index, node in enumerate(gm.graph.nodes)}
    swapped = []
    for node in gm.graph.nodes:
        if node.target not in _COMMUTATIVE or len(node.args) != 2 or node.kwargs.get("alpha", 1) != 1:
            continue
        first, second = node.args
        if not isinstance(second, Node) or _cannot_take_result(second, node, order):
            continue
        if _cannot_take_result(first, node, order):
            node.args = (second, first)
            swapped.append(node)
    return swapped


def _shielded(op: Any) -> Any:
    """A plain function calling ``op``: torch's pass only rewrites ``OpOverload`` targets."""

    def keep_functional(*args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    keep_functional.__name__ = keep_functional.__qualname__ = f"keep_functional_{op.__name__.replace('.', '_')}"
    return keep_functional


def _symbolic(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride()))


def _nbytes(value: Any) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def _run_torch_pass(gm: GraphModule, sample: list[Any], refused: set[Node]) -> tuple[list[Node], list[Node]]:
    """Run torch's pass with passkit's guards, ``refused`` nodes kept functional too; return the
    nodes it made in-place and the (scatter) nodes it removed, in graph order."""
    before = {n: n.target for n in gm.graph.nodes if n.op == "call_function"}
    swapped = _put_dying_operand_first(gm)
    shielded = {n: n.target for n in before if n in refused or _must_stay_functional(n)}
    for node, op in shielded.items():
        node.target = _shielded(op)
    try:
        _torch.reinplace_graph(gm, sample)
    finally:
        for node, op in shielded.items():
            node.target = op
        for node in swapped:
            if node.target is before[node]:  # not reinplaced after all: the graph stays as it was
                node.args = tuple(reversed(node.args))
        gm.recompile()
    remaining = {n for n in gm.graph.nodes if n.op == "call_function"}
    made_inplace = [n for n, target in before.items() if n in remaining and n.target is not target]
    removed = [n for n in before if n not in remaining]
    return made_inplace, removed


def _trial_copy(gm: GraphModule) -> tuple[GraphModule, dict[Node, Node]]:
    """A copy of ``gm`` to try the pass on, and the map from its nodes to ``gm``'s."""
    graph, copies = torch.fx.Graph(), {}
    graph.output(graph.graph_copy(gm.graph, copies))
    graph._codegen = gm.graph._codegen
    return GraphModule(gm, graph), {copy: node for node, copy in copies.items()}


def _refusals(gm: GraphModule, sample: list[Any], ask: Ask) -> set[Node]:
    """Ask about each conversion torch's pass would make, once per node, in graph order.

    The pass decides every conversion at once, so it runs on a copy to learn them. Keeping a
    refused op functional can let the pass convert another op it did not before; that one is
    asked about in turn, until a copy converts nothing new that is refused. The real run, with
    the same ops kept functional, then converts exactly what the last copy did.
    """
    refused: set[Node] = set()
    asked: set[Node] = set()
    while True:
        trial, original = _trial_copy(gm)
        made_inplace, removed = _run_torch_pass(trial, sample, {c for c, n in original.items() if n in refused})
        conversions = {original[n]: (n.target, "inplace") for n in made_inplace}
        conversions.update({original[n]: (n.target, "scatter") for n in removed})
        fresh = [node for node in gm.graph.nodes if node in conversions and node not in asked]
        for node in fresh:
            asked.add(node)
            if not ask(node, *conversions[node]):
                refused.add(node)
        if not any(node in refused for node in fresh):
            return refused


def _reinplace_graph(gm: GraphModule, ask: Ask | None = None) -> tuple[int, int, int, str | None]:
    """Reinplace one graph: (ops made in-place, scatters removed, bytes not allocated, why skipped)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sample = [n.meta.get("val") for n in placeholders]
    if any(_symbolic(v) for v in sample):
        return 0, 0, 0, "symbolic shapes"  # torch's pass re-derives metadata without a shape environment
    if any(v is None for v in sample):
        return 0, 0, 0, "an input without meta['val']"
    if _torch.makes_unbacked_sizes(gm):
        return 0, 0, 0, "data-dependent sizes"  # their fake rules need a shape environment, which torch's pass lacks
    if _torch.needs_shape_env(gm):
        return 0, 0, 0, "while_loop"  # its fake rule needs a shape environment, which torch's pass lacks
    refused = _refusals(gm, sample, ask) if ask is not None else set()
    made_inplace, removed = _run_torch_pass(gm, sample, refused)
    saved = sum(_nbytes(n.meta.get("val")) for n in made_inplace + removed)
    return len(made_inplace), len(removed), saved, None


def _asker(context: StepContext | None, graph_name: str) -> Ask | None:
    """Each conversion becomes one ``passkit_should_apply`` ask naming the node and its op."""
    if context is None or context.hook is None or not context.hook.passkit_should_apply.get_hookimpls():
        return None  # nobody to ask: spare the trial run

    def ask(node: Node, converted: Any, kind: str) -> bool:
        op = _torch.op_name(node.target) or str(node.target)
        name = f"{op} -> {_torch.op_name(converted) or converted}" if kind == "inplace" else f"{op} -> copy_"
        source = source_line(node) or ""
        return context.should_apply(kind="reinplace", name=name, group="", graph=graph_name, nodes=(node.name,), source=source)

    return ask


@graph_pass("reinplace", requires={"functional"}, invalidates={"functional"})
def reinplace(program: Program, *, graphs: list[str] | None = None, context: StepContext | None = None) -> bool:
    """Make functional ops in-place where nothing else reads their input (post-grad; fewer bytes allocated)."""
    if "joint" in program.graphs or (program.training and "main" in program.graphs):
        found = "joint" if "joint" in program.graphs else "main"
        raise PassError(
            f"reinplace: a training program is reinplaced after partitioning (found graph {found!r}); "
            "put the step after the partition step"
        )
    names = graphs if graphs is not None else list(program.graphs)
    unknown = [name for name in names if name not in program.graphs]
    if unknown:
        raise PassError(f"reinplace: no graph {unknown[0]!r} (graphs: {', '.join(program.graphs)})")
    made = scatters = saved = 0
    skipped: dict[str, str] = {}
    for name in names:
        count, removed, nbytes, reason = _reinplace_graph(program.graphs[name], _asker(context, name))
        if reason is not None:
            skipped[name] = reason
        made, scatters, saved = made + count, scatters + removed, saved + nbytes
    program.record_stat("reinplaced", made)
    program.record_stat("scatters_removed", scatters)
    program.record_stat("bytes_not_allocated", saved)
    if skipped:
        program.record_stat("skipped", skipped)
    return made + scatters > 0


@hookimpl
def passkit_register_passes() -> list:
    return [reinplace]
