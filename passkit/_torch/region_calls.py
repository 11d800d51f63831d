"""Own how a graph that calls outlined regions is compiled as Python calling Inductor's code:
each distinct body once, each run of other ops once, and a small FX graph that calls them.

Inductor lowers ``invoke_subgraph`` by compiling the body once, but it still lowers, schedules
and writes code for every call and every one of its results (a transformer layer's forward
returns twenty-odd saved values): about a tenth of a second a call on two cores, the part of a
compile that grows with depth. Here the graph is cut at its calls instead:

- every distinct body (its identifier and its operands' layouts) goes through Inductor's inner
  compiler on its own, with every result in the layout the trace gave it, so what the next call
  or the backward receives is known without asking Inductor;
- each run of other ops between two calls is compiled as a graph of its own, or kept as it is
  when it only makes views (no kernel to write);
- an FX graph calls them in the graph's order, taking its inputs boxed and dropping each value
  after its last use, as Inductor's code does, so saved activations die as the backward goes.

Nothing is moved past a call, so random draws keep their order. A graph that mutates an input,
has symbolic sizes, or would need more than ``MAX_COMPILED_RUNS`` runs compiled is not cut
(``compile_region_calls`` returns None) and Inductor lowers it whole.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch.fx import Graph, GraphModule, Node
from torch.fx.graph import _BoxedCodeGen

from passkit._torch.inductor_cache import fakes_with_shape_env, static_input_specs
from passkit._torch.tracing import fake_mode_of

__all__ = ["MAX_COMPILED_RUNS", "RegionCalls", "compile_region_calls"]

# Each compiled run is one more Inductor compile (a few tenths of a second): past this many, the
# graph is not a chain of layers and one Inductor graph costs less.
MAX_COMPILED_RUNS = 8

CompilePiece = Callable[[GraphModule, list[Any], tuple[int, ...]], Any]
"""Compile one piece (a body or a run) with every output in its traced layout, letting it write
into the inputs at the given positions; returns Inductor's compiled graph."""


@dataclass
class RegionCalls:
    """A graph compiled as Python calling compiled pieces; called boxed, like Inductor's code."""

    current_callable: Callable[[list[Any]], Any]
    output_strides: list[tuple[int, ...] | None]
    source_code: str
    device_types: set[str]
    bodies: int
    compiled_runs: int
    piece_keys: list[Any] = field(default_factory=list)  # Inductor's FX graph cache key of each piece
    pieces: list[Any] = field(default_factory=list)  # each piece as Inductor compiled it (its kernels' scope)

    def __call__(self, args: list[Any]) -> Any:
        return self.current_callable(args)


def _is_call(node: Node) -> bool:
    return node.op == "call_function" and node.target is torch.ops.higher_order.invoke_subgraph


def _mutates(node: Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def _only_views(run: list[Node]) -> bool:
    return all(n.target is operator.getitem or (isinstance(n.target, torch._ops.OpOverload) and n.target.is_view)
               for n in run)


def _runs_and_calls(gm: GraphModule) -> list[list[Node] | Node] | None:
    """The graph's calls and the runs of other ops between them, in graph order; the results a
    call hands out (``getitem``) belong to the call. None when the graph must not be cut."""
    pieces: list[list[Node] | Node] = []
    run: list[Node] = []
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if _is_call(node):
            if run:
                pieces.append(run)
                run = []
            pieces.append(node)
        elif node.target is operator.getitem and isinstance(node.args[0], Node) and _is_call(node.args[0]):
            continue
        elif node.op != "call_function" or _mutates(node):
            return None
        else:
            run.append(node)
    if run:
        pieces.append(run)
    return pieces


def _plain_examples(values: Sequence[Any]) -> list[Any] | None:
    """Fresh fakes with the layouts of ``values`` (whose grad flags Inductor does not read), in
    a fake mode with a shape environment as Inductor's FX graph cache wants; None if symbolic."""
    specs = static_input_specs(values)
    if specs is None:
        return None
    return fakes_with_shape_env([(*s[:-1], False) if s[0] == "tensor" else s for s in specs])


def _run_module(gm: GraphModule, run: list[Node]) -> tuple[GraphModule, list[Node], list[Node]]:
    """The run as a graph of its own: what it reads from outside, and what is read after it."""
    inside = set(run)
    graph, env, reads = Graph(), {}, []

    def operand(node: Node) -> Node:
        if node not in env:
            if node.op == "get_attr":
                env[node] = graph.get_attr(node.target)
            else:
                env[node] = graph.placeholder(node.name)
                env[node].meta = dict(node.meta)
                reads.append(node)
        return env[node]

    for node in run:
        env[node] = graph.node_copy(node, operand)
    results = [n for n in run if any(user not in inside for user in n.users)]
    graph.output(tuple(env[n] for n in results))
    return GraphModule(gm, graph), reads, results


def _body_key(identifier: Any, operands: Sequence[Any]) -> tuple[Any, str]:
    """What one compile of a body serves: its identifier and its operands' layouts."""
    return identifier, repr(static_input_specs(operands))


def _writable_operands(gm: GraphModule, donated: Sequence[int],
                       example: Callable[[Node], Any]) -> dict[tuple[Any, str], tuple[int, ...]]:
    """For each body compile, the operand positions every one of its calls may write into: a
    donated input that the call reads last, and only once. One compile serves all the calls, so
    a position counts only where it holds at each of them (the first layer's input does not)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    dead = {placeholders[k] for k in donated}
    last: dict[Node, Node] = {}
    for node in gm.graph.nodes:
        for read in node.all_input_nodes:
            if read in dead:
                last[read] = node
    writable: dict[tuple[Any, str], set[int]] = {}
    for call in filter(_is_call, gm.graph.nodes):
        operands = list(call.args[2:])
        here = {k for k, a in enumerate(operands) if last.get(a) is call and operands.count(a) == 1}
        key = _body_key(call.args[1], [example(a) for a in operands])
        writable[key] = writable[key] & here if key in writable else here
    return {key: tuple(sorted(positions)) for key, positions in writable.items()}


def _fresh_copy(body: GraphModule) -> GraphModule:
    """A copy of ``body`` for Inductor to rewrite, holding only its graph and what it reads: a
    module's other attributes join the key of Inductor's FX graph cache, and a body the compile
    cache rebuilt has none of them."""
    graph = Graph()
    graph.output(graph.graph_copy(body.graph, {}))
    return GraphModule(body, graph)


def _propagate_values(gm: GraphModule, example_inputs: Sequence[Any]) -> None:
    """Give each node of ``gm`` its example value (``meta["val"]``), a body's results worked out
    once per body and operand layouts (dispatching ``invoke_subgraph`` on fakes trips over the
    fake modes of the bodies' earlier traces)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = fake_mode_of(example_inputs)
    results: dict[tuple[Any, str], Any] = {}

    class Propagate(torch.fx.Interpreter):
        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            if target is not torch.ops.higher_order.invoke_subgraph:
                with mode:
                    return super().call_function(target, args, kwargs)
            key = _body_key(args[1], args[2:])
            if key not in results:
                results[key] = FakeTensorProp(copy.deepcopy(args[0]), mode).propagate_dont_convert_inputs(*args[2:])
            return results[key]

        def run_node(self, node: Node) -> Any:
            value = super().run_node(node)
            node.meta["val"] = value
            return value

    Propagate(gm).run(*example_inputs)


def _boxed_call(fn: Callable[[list[Any]], Any], name: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        return fn(list(args))

    call.__name__ = call.__qualname__ = name
    return call


def compile_region_calls(gm: GraphModule, example_inputs: Sequence[Any], compile_piece: CompilePiece,
                         callable_of: Callable[[Any], Callable[[list[Any]], Any]],
                         source_of: Callable[[Any], str | None], donated: Sequence[int] = ()) -> RegionCalls | None:
    """``gm`` compiled as Python calling each distinct body and each run of other ops compiled
    once (``compile_piece``), or None when it calls no region or must be lowered whole.

    ``donated`` lists the graph's inputs whose memory it may write into (a backward's dead saved
    values); a call may write into those it is the last to read, as the whole graph would."""
    pieces = _runs_and_calls(gm)
    if not pieces or not any(isinstance(p, Node) for p in pieces) or static_input_specs(example_inputs) is None:
        return None
    compiled_runs = [p for p in pieces if isinstance(p, list) and not _only_views(p)]
    if len(compiled_runs) > MAX_COMPILED_RUNS:
        return None
    examples: dict[Node, Any] = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), example_inputs))
    if any("val" not in n.meta for n in gm.graph.nodes if n.op == "call_function"):
        _propagate_values(gm, example_inputs)  # a graph the compile cache rebuilt carries none

    def example(node: Node) -> Any:
        return examples[node] if node in examples else node.meta.get("val")

    graph, env = Graph(), {}
    graph.set_codegen(_BoxedCodeGen())
    bodies: dict[tuple[Any, ...], Callable[..., Any]] = {}
    sources: list[str] = []
    compiled_pieces: list[Any] = []
    device_types: set[str] = set()

    def compiled_piece(module: GraphModule, values: list[Any], name: str,
                       writable: tuple[int, ...] = ()) -> Callable[..., Any] | None:
        fakes = _plain_examples(values)
        if fakes is None:
            return None
        compiled = compile_piece(module, fakes, writable)
        compiled_pieces.append(compiled)
        device_types.update(getattr(compiled, "device_types", ()) or ())
        sources.append(f"# {name}\n{source_of(compiled) or ''}")
        return _boxed_call(callable_of(compiled), name)

    def operand(node: Node) -> Node:
        if node not in env and node.op == "get_attr":  # a constant a run of views reads
            env[node] = graph.get_attr(node.target)
        return env[node]

    def emit(node: Node, target: Any, args: tuple[Any, ...]) -> None:
        env[node] = graph.call_function(target, args)
        env[node].meta = dict(node.meta)

    writable = _writable_operands(gm, donated, example)
    ends = {p[-1]: p for p in pieces if isinstance(p, list)}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = graph.placeholder(node.name)
            env[node].meta = dict(node.meta)
        elif node.op == "output":
            graph.output(torch.fx.map_arg(node.args[0], operand))
        elif _is_call(node):
            operands = list(node.args[2:])
            values = [example(a) for a in operands]
            key = _body_key(node.args[1], values)
            if key not in bodies:
                call = compiled_piece(_fresh_copy(getattr(gm, node.args[0].target)), values, f"body_{len(bodies)}",
                                      writable[key])
                if call is None:
                    return None
                bodies[key] = call
            emit(node, bodies[key], tuple(operand(a) for a in operands))
        elif node.target is operator.getitem and isinstance(node.args[0], Node) and _is_call(node.args[0]):
            emit(node, operator.getitem, (operand(node.args[0]), node.args[1]))
        elif node in ends:  # a run is emitted where its last node was: all it reads exists by then
            run = ends[node]
            if _only_views(run):
                for member in run:
                    env[member] = graph.node_copy(member, operand)
                continue
            module, reads, results = _run_module(gm, run)
            call = compiled_piece(module, [example(r) for r in reads], f"run_{len(sources)}")
            if call is None:
                return None
            out = graph.call_function(call, tuple(operand(r) for r in reads))
            for k, result in enumerate(results):
                emit(result, operator.getitem, (out, k))
    program = GraphModule(gm, graph)
    outputs = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    strides = [tuple(example(n).stride()) if isinstance(n, Node) and isinstance(example(n), torch.Tensor) else None
               for n in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]
    return RegionCalls(
        current_callable=program.forward, output_strides=strides,
        source_code="\n\n".join([program.code, *sources]), device_types=device_types or {"cpu"},
        bodies=len(bodies), compiled_runs=len(compiled_runs), pieces=compiled_pieces,
    )
