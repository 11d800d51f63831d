"""Own the ``regions`` pass: find the repeated layers of a captured program and outline each into
``invoke_subgraph``, so that every later stage works on each distinct layer once.

A deep model is mostly the same layer many times (the blocks of an ``nn.ModuleList`` or
``nn.Sequential``). Dynamo inlines them all into one graph, and without this pass every later
stage (functionalize, joint, partition, Inductor's lowering) handles every copy. The pass finds
the layers and their structural keys (``region_layers``) and replaces each layer by
``invoke_subgraph(body, identifier, *operands)`` on one body shared by all its repeats. torch
traces and differentiates a body once per identifier, and Inductor lowers one body once, so
compile time grows with the number of distinct layers, not with depth.

Regions already marked (the user's ``torch.compiler.nested_compile_region``, or ``trace_once``'s)
arrive as ``invoke_subgraph`` and stay as they are; an inline layer that computes what such a
body computes joins it (``marked_regions``).
"""

from __future__ import annotations

import operator
from typing import Annotated, Any

import pydantic
import torch
from torch.fx import Graph, GraphModule, Node

from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.regions.marked import UserBody, traced_once_repeats, user_bodies
from passkit.regions.layers import (Layer, container_label, example_value, find_layers, merged,
                                          operands_needing_grad)
from passkit.core.program import Program

__all__ = ["regions", "outline", "TRACED_ONCE_NOTE"]


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
        setattr(gm, name, _body(gm, max(layers, key=operands_needing_grad)))
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
            call.meta["example_value"] = tuple(example_value(node) for node in layer.results)
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


TRACED_ONCE_NOTE = "traced_once"  # program.notes: the layer classes Dynamo traced once (passkit.regions.traced_once)


@graph_pass("regions", requires={"captured"})
def regions(program: Program, *, min_repeats: int = 2, min_nodes: int = 8,
            layers_per_region: Annotated[int, pydantic.Strict(), pydantic.Field(ge=1, le=64)] = 1,
            trace_once: bool = False) -> bool:
    """Outline repeated layers (same code, shapes and dtypes) into shared ``invoke_subgraph`` bodies.

    ``trace_once``: ``passkit.compile`` has Dynamo trace each repeated layer once
    (``passkit.regions.traced_once``); this step then joins the layer Dynamo left inline to its body.
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
        for layer in (merged(layers, layers_per_region) if layers_per_region > 1 else layers):
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
        label = f"{container_label(container)}.* ({layers[0].kind.rsplit('.', 1)[-1]}, {len(layers[0].nodes)} nodes)"
        found[label] = len(layers)
        spared += (len(layers) - 1) * len(layers[0].nodes)
    traced_once = traced_once_repeats(gm, marked, program.notes.get(TRACED_ONCE_NOTE, ()))
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


@hookimpl
def passkit_register_passes() -> list:
    return [regions]
