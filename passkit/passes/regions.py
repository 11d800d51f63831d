"""Own the ``regions`` pass: find the repeated layers of a captured program and outline each into
``invoke_subgraph``, so that every later stage works on each distinct layer once.

A deep model is mostly the same layer many times (the blocks of an ``nn.ModuleList`` or
``nn.Sequential``). Dynamo inlines them all into one graph, and without this pass every later
stage (functionalize, joint, partition, Inductor's lowering) handles every copy. The pass groups
the captured graph's nodes by the outermost indexed module on their ``nn_module_stack``
(``blocks.3``), confirms that two layers compute the same thing with a structural key (op targets,
constants, wiring, and each value's shape, stride, dtype and ``requires_grad``; operands may
differ in ``requires_grad``), and replaces each
layer by ``invoke_subgraph(body, identifier, *operands)`` on one body shared by all its repeats.
torch traces and differentiates a body once per identifier, and Inductor lowers one body once,
so compile time grows with the number of distinct layers, not with depth.

A layer is left inline when it cannot be outlined safely: it mutates a value from outside,
toggles grad mode or another global, carries ``recompute`` tags, takes or returns something other
than a tensor, or is not a contiguous piece of the graph's dependencies. Regions the user already
marked with ``torch.compiler.nested_compile_region`` arrive as ``invoke_subgraph`` and stay as
they are; an inline layer that computes what such a body computes joins it. Dynamo leaves one
inline when its call was the only one of its kind, as the first layer of a marked stack is (its
input needs no grad, the others' do), and Inductor would otherwise lower that layer on its own.
"""

from __future__ import annotations

import hashlib
import operator
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

import pydantic
import torch
from torch.fx import Graph, GraphModule, Node

from passkit import _torch
from passkit.hookspecs import hookimpl
from passkit.pass_api import graph_pass
from passkit.program import Program

__all__ = ["regions", "Layer", "find_layers", "outline"]

# One instance of a container's item: "L['self'].blocks.3" -> ("L['self'].blocks", "3").
_INDEXED = re.compile(r"^(?P<container>.+?)(?:\.|\[)(?P<index>\d+)\]?$")
# Calls whose effect is global state rather than a value: a layer holding one stays inline.
_GLOBAL_EFFECTS = ("_set_grad_enabled", "set_grad_enabled", "_enter_autocast", "_exit_autocast", "_record_function")


@dataclass
class Layer:
    """One instance of a container item: its nodes in graph order, operands and results."""

    path: str
    container: str
    kind: str
    nodes: list[Node] = field(default_factory=list)
    operands: list[Node] = field(default_factory=list)
    results: list[Node] = field(default_factory=list)
    key: str = ""


def _instance_of(node: Node) -> tuple[str, str, str] | None:
    """The outermost indexed module ``node`` belongs to: (path, container, class name)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    for path, kind in stack.values():
        match = _INDEXED.match(str(path))
        if match:
            return str(path), match.group("container"), getattr(kind, "__qualname__", str(kind))
    return None


def find_layers(gm: GraphModule) -> list[Layer]:
    """Every indexed layer of ``gm``'s top level, with its nodes, operands, results and key."""
    layers: dict[str, Layer] = {}
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        found = _instance_of(node)
        if found is None:
            continue
        path, container, kind = found
        layers.setdefault(path, Layer(path, container, kind)).nodes.append(node)
    usable = []
    for layer in layers.values():
        if _describe(layer):
            usable.append(layer)
    return usable


def _describe(layer: Layer) -> bool:
    """Fill the layer's operands, results and structural key; False if it cannot be outlined."""
    members = set(layer.nodes)
    if not _contiguous(layer, members):
        return False
    operands: dict[Node, int] = {}
    local: dict[Node, int] = {}
    parts: list[Any] = []

    def canon(arg: Any) -> Any:
        if isinstance(arg, Node):
            if arg in members:
                return ("n", local[arg])
            if arg not in operands:
                operands[arg] = len(operands)
            return ("in", operands[arg])
        if isinstance(arg, (list, tuple)):
            return (type(arg).__name__, tuple(canon(a) for a in arg))
        if isinstance(arg, dict):
            return ("dict", tuple(sorted((str(k), canon(v)) for k, v in arg.items())))
        if isinstance(arg, torch.Tensor):
            return ("tensor", id(arg))  # a constant tensor: equal only to itself
        return ("const", type(arg).__name__, repr(arg))

    for position, node in enumerate(layer.nodes):
        if not _outlinable(node, members):
            return False
        parts.append((node.op, _target_name(node.target), canon(node.args), canon(node.kwargs), _value_key(node)))
        local[node] = position
    layer.operands = list(operands)
    layer.results = [node for node in layer.nodes if any(user not in members for user in node.users)]
    if not layer.results:
        return False
    for value in (*layer.operands, *layer.results):
        if not isinstance(_example(value), torch.Tensor):
            return False
    parts.append(("operands", tuple(_operand_key(node) for node in layer.operands)))
    parts.append(("results", tuple(local[node] for node in layer.results)))
    layer.key = hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
    return True


def _contiguous(layer: Layer, members: set[Node]) -> bool:
    """Whether no node outside the layer both reads one of its values and feeds one of its nodes."""
    order = list(layer.nodes[0].graph.nodes)
    first, last = order.index(layer.nodes[0]), order.index(layer.nodes[-1])
    downstream: set[Node] = set()
    for node in order[first : last + 1]:
        inputs = node.all_input_nodes
        if node in members:
            if any(value in downstream for value in inputs):
                return False
        elif any(value in members or value in downstream for value in inputs):
            downstream.add(node)
    return True


def _outlinable(node: Node, members: set[Node]) -> bool:
    if node.meta.get("recompute") is not None or node.op == "call_module":
        return False
    name = _target_name(node.target)
    if any(effect in name for effect in _GLOBAL_EFFECTS):
        return False
    if _torch.is_higher_order(node.target) and name.endswith("invoke_subgraph"):
        return False  # the user's own region: keep it as it is
    if _torch.writes_in_place(node) and node.args and isinstance(node.args[0], Node) and node.args[0] not in members:
        return False
    return True


def _target_name(target: Any) -> str:
    if isinstance(target, str):
        return target
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or str(target)
    return f"{module}.{name}" if module else str(name)


def _example(node: Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def _value_key(node: Node, *, with_grad: bool = True) -> Any:
    value = _example(node)
    if isinstance(value, torch.Tensor):
        grad = value.requires_grad if with_grad else None
        return ("t", tuple(value.shape), tuple(value.stride()), str(value.dtype), grad, str(value.device))
    if isinstance(value, (list, tuple)):
        return tuple(_value_key_of(v) for v in value)
    return _value_key_of(value)


def _operand_key(node: Node) -> Any:
    """An operand's key without ``requires_grad``: the first layer of a stack reads the model's
    input, which needs no grad, and still shares the body (``joint`` differentiates that operand
    in every call of the body, ``_torch.region_operands_differentiated``)."""
    return _value_key(node, with_grad=False)


def _operands_needing_grad(layer: Layer) -> int:
    return sum(bool(getattr(_example(operand), "requires_grad", False)) for operand in layer.operands)


def _value_key_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("t", tuple(value.shape), tuple(value.stride()), str(value.dtype), value.requires_grad)
    return type(value).__name__


def _body(gm: GraphModule, layer: Layer) -> GraphModule:
    """The layer as a graph of its own: operands in, results out as a tuple."""
    graph = Graph()
    env: dict[Node, Node] = {}
    for index, operand in enumerate(layer.operands):
        placeholder = graph.placeholder(f"operand_{index}")
        placeholder.meta.update({k: v for k, v in operand.meta.items() if k in ("example_value", "val", "tensor_meta")})
        env[operand] = placeholder
    for node in layer.nodes:
        env[node] = graph.node_copy(node, lambda value: env[value])
    graph.output(tuple(env[node] for node in layer.results))
    return GraphModule(gm, graph, class_name="Region")


def outline(gm: GraphModule, layers: list[Layer], name: str, identifier: str, replaced: dict[Node, Node],
            body: UserBody | None = None) -> None:
    """Replace each of ``layers`` (all with one key) by ``invoke_subgraph`` on one shared body:
    a new one named ``name``, or the user's ``body`` (whose ``identifier`` and attribute it keeps).

    ``replaced`` maps results of layers outlined before to the values that now stand for them;
    this call adds its own.
    """
    if body is None:
        # The body's placeholders record the operands of the layer that differentiates the most.
        setattr(gm, name, _body(gm, max(layers, key=_operands_needing_grad)))
    hop = torch.ops.higher_order.invoke_subgraph
    for layer in layers:
        members = set(layer.nodes)
        readers = _readers_inside(layer, members)
        anchor = layer.nodes[-1]
        operands = [replaced.get(operand, operand) for operand in layer.operands]
        if body is not None:
            operands = [operands[body.operand_of_placeholder[i]] for i in range(len(operands))]
        with gm.graph.inserting_before(anchor):
            call = gm.graph.call_function(hop, (gm.graph.get_attr(name), identifier, *operands))
            call.meta["nn_module_stack"] = _outer_stack(layer.nodes[0], layer.path)
            call.meta["stack_trace"] = layer.nodes[0].meta.get("stack_trace")
            call.meta["example_value"] = tuple(_example(node) for node in layer.results)
            if body is not None:  # in the order the body returns them
                call.meta["example_value"] = tuple(call.meta["example_value"][i] for i in body.result_of_output)
            values = []
            for index, result in enumerate(layer.results):
                output = body.result_of_output.index(index) if body is not None else index
                value = gm.graph.call_function(operator.getitem, (call, output))
                value.meta.update({k: v for k, v in result.meta.items() if k in _KEPT_META})
                values.append(value)
        for result, value in zip(layer.results, values):
            result.replace_all_uses_with(value, delete_user_cb=lambda user: user not in members)
            replaced[result] = value
        position = values[-1]
        for reader in readers:  # they read the results, so they now follow the call
            position.append(reader)
            position = reader
        for node in reversed(layer.nodes):
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()


_KEPT_META = ("example_value", "nn_module_stack", "stack_trace")


@dataclass
class UserBody:
    """A body the user marked, as a layer of its own graph: how its placeholders and outputs line
    up with the operands and results of an inline layer with the same key."""

    attribute: str
    identifier: str
    key: str
    operand_of_placeholder: list[int]  # placeholder i takes the layer's operand operand_of_placeholder[i]
    result_of_output: list[int]  # output i is the layer's result result_of_output[i]
    nodes: int = 0


def user_bodies(gm: GraphModule) -> tuple[dict[str, UserBody], dict[str, int]]:
    """The bodies of ``gm``'s own ``invoke_subgraph`` calls, by key, and how many calls each
    joined: of the bodies with one key, the one with the most calls is kept, and the calls of the
    others (torch 2.11 gives a marked layer called once a body of its own, as the first layer of
    a marked stack is: its input needs no grad) now call it. A body whose placeholders or outputs
    do not map one to one onto a layer's operands and results is left out, and its calls alone."""
    calls: dict[str, list[tuple[Node, UserBody]]] = {}
    described: dict[tuple[str, str], UserBody | None] = {}
    for node in gm.graph.nodes:
        if not (_torch.is_higher_order(node.target) and _target_name(node.target).endswith("invoke_subgraph")):
            continue
        attribute_node, identifier = node.args[0], node.args[1]
        if not isinstance(attribute_node, Node) or attribute_node.op != "get_attr" or not isinstance(identifier, str):
            continue
        graph_module = getattr(gm, str(attribute_node.target), None)
        if not isinstance(graph_module, GraphModule):
            continue
        seen = (str(attribute_node.target), identifier)
        if seen not in described:
            described[seen] = _as_user_body(graph_module, *seen)
        body = described[seen]
        if body is not None:
            calls.setdefault(body.key, []).append((node, body))
    found: dict[str, UserBody] = {}
    joined: dict[str, int] = {}
    for key, key_calls in calls.items():
        counts: dict[str, int] = {}
        for _, body in key_calls:
            counts[body.identifier] = counts.get(body.identifier, 0) + 1
        kept = next(body for _, body in key_calls if counts[body.identifier] == max(counts.values()))
        found[key] = kept
        for call, body in key_calls:
            if body.identifier != kept.identifier:
                _redirect(gm, call, body, kept)
                joined[kept.identifier] = joined.get(kept.identifier, 0) + 1
    if joined:
        gm.graph.lint()
        gm.recompile()
    return found, joined


def _redirect(gm: GraphModule, call: Node, body: UserBody, kept: UserBody) -> None:
    """Make ``call`` of ``body`` call ``kept`` (same key), its operands and results lined up."""
    by_operand = {operand: call.args[2 + placeholder] for placeholder, operand in enumerate(body.operand_of_placeholder)}
    with gm.graph.inserting_before(call):
        attribute = gm.graph.get_attr(kept.attribute)
    former = call.args[0]
    call.args = (attribute, kept.identifier, *(by_operand[operand] for operand in kept.operand_of_placeholder))
    if isinstance(former, Node) and not former.users:
        gm.graph.erase_node(former)
    output_of = {result: output for output, result in enumerate(kept.result_of_output)}
    example = call.meta.get("example_value")
    if isinstance(example, (tuple, list)):
        call.meta["example_value"] = tuple(example[body.result_of_output.index(r)] for r in kept.result_of_output)
    for user in list(call.users):
        if user.target is operator.getitem and isinstance(user.args[1], int):
            user.args = (call, output_of[body.result_of_output[user.args[1]]])


def _as_user_body(body: GraphModule, attribute: str, identifier: str) -> UserBody | None:
    nodes = [n for n in body.graph.nodes if n.op in ("call_function", "call_method")]
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    outputs = list(body.graph.output_node().args[0]) if nodes else []
    layer = Layer(attribute, "", "", nodes)
    if not nodes or not _describe(layer) or len(set(outputs)) != len(outputs):
        return None
    if set(layer.operands) != set(placeholders) or set(layer.results) != set(outputs):
        return None
    return UserBody(attribute, identifier, layer.key,
                    [layer.operands.index(p) for p in placeholders],
                    [layer.results.index(o) for o in outputs], len(nodes))


def _readers_inside(layer: Layer, members: set[Node]) -> list[Node]:
    """Nodes between the layer's first and last node, not in it, that depend on it (in order)."""
    order = list(layer.nodes[0].graph.nodes)
    first, last = order.index(layer.nodes[0]), order.index(layer.nodes[-1])
    readers: list[Node] = []
    for node in order[first : last + 1]:
        if node not in members and any(value in members or value in readers for value in node.all_input_nodes):
            readers.append(node)
    return readers


def _outer_stack(node: Node, path: str) -> dict[str, Any]:
    """``node``'s module stack down to the layer itself (the call is the layer)."""
    kept: dict[str, Any] = {}
    for key, entry in node.meta.get("nn_module_stack", {}).items():
        kept[key] = entry
        if entry[0] == path:
            break
    return kept


def _index(layer: Layer) -> int:
    return int(_INDEXED.match(layer.path).group("index"))  # type: ignore[union-attr]


def _merged(layers: list[Layer], size: int) -> list[Layer]:
    """``layers`` (one container, one key) with each ``size`` consecutive ones made one layer;
    a run that cannot be one (other nodes between them, say) and the last few stay single."""
    order = {node: i for i, node in enumerate(layers[0].nodes[0].graph.nodes)}
    ordered = sorted(layers, key=_index)
    result: list[Layer] = []
    start = 0
    while start < len(ordered):
        run = ordered[start:start + size]
        consecutive = len(run) == size and all(_index(b) == _index(a) + 1 for a, b in zip(run, run[1:]))
        if consecutive:
            first, last = run[0], run[-1]
            merged = Layer(f"{first.path}-{_index(last)}", first.container, f"{first.kind} x{size}",
                           sorted((n for layer in run for n in layer.nodes), key=order.__getitem__))
            if _describe(merged):
                result.append(merged)
                start += size
                continue
        result.append(ordered[start])
        start += 1
    return result


TRACED_ONCE_NOTE = "traced_once"  # program.notes: the layer classes Dynamo traced once (passkit.traced_once)


@graph_pass("regions", requires={"captured"})
def regions(program: Program, *, min_repeats: int = 2, min_nodes: int = 8,
            layers_per_region: Annotated[int, pydantic.Strict(), pydantic.Field(ge=1, le=64)] = 1,
            trace_once: bool = False) -> bool:
    """Outline repeated layers (same code, shapes and dtypes) into shared ``invoke_subgraph`` bodies.

    ``trace_once``: ``passkit.compile`` has Dynamo trace each repeated layer once
    (``passkit.traced_once``); this step then joins the layer Dynamo left inline to its body.
    """
    if program.notes.get(TRACED_ONCE_NOTE):
        program.record_stat("traced_once", list(program.notes[TRACED_ONCE_NOTE]))
    if "functional" in program.facts or "main" not in program.graphs:
        program.record_stat("regions", 0)
        return False
    gm = program.graphs["main"]
    marked, joined = user_bodies(gm)
    singles: dict[tuple[str, str], list[Layer]] = {}
    for layer in find_layers(gm):
        if len(layer.nodes) >= min_nodes:
            singles.setdefault((layer.container, layer.key), []).append(layer)
    groups: dict[tuple[str, str], list[Layer]] = {}
    for layers in singles.values():
        for layer in (_merged(layers, layers_per_region) if layers_per_region > 1 else layers):
            groups.setdefault((layer.container, layer.key), []).append(layer)
    found: dict[str, int] = {}
    replaced: dict[Node, Node] = {}
    spared = sum(joined.get(body.identifier, 0) * body.nodes for body in marked.values())
    for number, ((container, key), layers) in enumerate(sorted(groups.items(), key=lambda item: item[1][0].nodes[0].name)):
        if key in marked:
            body = marked[key]
            outline(gm, layers, body.attribute, body.identifier, replaced, body)
            joined[body.identifier] = joined.get(body.identifier, 0) + len(layers)
            spared += len(layers) * len(layers[0].nodes)
            continue
        if len(layers) < min_repeats:
            continue
        name = f"passkit_region_{number}"
        outline(gm, layers, name, f"passkit_region_{key}", replaced)
        label = f"{_short(container)}.* ({layers[0].kind.rsplit('.', 1)[-1]}, {len(layers[0].nodes)} nodes)"
        found[label] = len(layers)
        spared += (len(layers) - 1) * len(layers[0].nodes)
    traced_once = _traced_once_repeats(gm, marked, program.notes.get(TRACED_ONCE_NOTE, ()))
    for label, (calls, body) in traced_once.items():
        found[label] = calls  # passkit's regions too, found before Dynamo traced them
        spared += (calls - 1 - joined.get(body.identifier, 0)) * body.nodes
    program.record_stat("regions", len(found))
    if found:
        program.record_stat("repeats", found)
    if joined:
        program.record_stat("joined_marked", joined)
    if found or joined:
        program.record_stat("spared_nodes", spared)
    return bool(found or joined)


def _traced_once_repeats(gm: GraphModule, marked: dict[str, UserBody], kinds: Any) -> dict[str, tuple[int, UserBody]]:
    """The bodies ``trace_once`` marked (a layer class in ``kinds``), labelled as the step labels
    the layers it outlines itself, with their calls now."""
    calls: dict[str, list[Node]] = {}
    for node in gm.graph.nodes:
        if _torch.is_higher_order(node.target) and _target_name(node.target).endswith("invoke_subgraph"):
            calls.setdefault(str(node.args[1]), []).append(node)
    repeats: dict[str, tuple[int, UserBody]] = {}
    for body in marked.values():
        body_calls = calls.get(body.identifier, [])
        stack = list(body_calls[0].meta.get("nn_module_stack", {}).values()) if body_calls else []
        if len(body_calls) < 2 or not stack:
            continue
        path, kind = stack[-1][0], getattr(stack[-1][1], "__name__", str(stack[-1][1]))
        if kind in kinds:
            container = _short(re.sub(r"\.\d+$", "", path))
            repeats[f"{container}.* ({kind}, {body.nodes} nodes)"] = (len(body_calls), body)
    return repeats


def _short(container: str) -> str:
    return re.sub(r"^L\['self'\]\.?", "", container) or container


@hookimpl
def passkit_register_passes() -> list:
    return [regions]
