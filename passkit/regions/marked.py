"""Own the bodies already marked when the ``regions`` step runs: the user's
``torch.compiler.nested_compile_region`` layers and those ``trace_once`` marked.

Each such body is described as a layer of its own graph, so that an inline layer with the same
structural key can join it (``regions`` outlines that layer onto the body), and two marked bodies
with one key become one: torch 2.11 gives a marked layer called once a body of its own, as the
first layer of a marked stack is (its input needs no grad, the others' do), and Inductor would
otherwise lower it on its own.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule, Node

from passkit.regions.layers import Layer, container_label, describe, is_region_call

__all__ = ["UserBody", "traced_once_repeats", "user_bodies"]


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
        if not is_region_call(node):
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
    if not nodes or not describe(layer) or len(set(outputs)) != len(outputs):
        return None
    if set(layer.operands) != set(placeholders) or set(layer.results) != set(outputs):
        return None
    return UserBody(attribute, identifier, layer.key,
                    [layer.operands.index(p) for p in placeholders],
                    [layer.results.index(o) for o in outputs], len(nodes))


def traced_once_repeats(gm: GraphModule, marked: dict[str, UserBody], kinds: Any) -> dict[str, tuple[int, UserBody]]:
    """The bodies ``trace_once`` marked (a layer class in ``kinds``), labelled as the step labels
    the layers it outlines itself, with their calls now."""
    calls: dict[str, list[Node]] = {}
    for node in gm.graph.nodes:
        if is_region_call(node):
            calls.setdefault(str(node.args[1]), []).append(node)
    repeats: dict[str, tuple[int, UserBody]] = {}
    for body in marked.values():
        body_calls = calls.get(body.identifier, [])
        stack = list(body_calls[0].meta.get("nn_module_stack", {}).values()) if body_calls else []
        if len(body_calls) < 2 or not stack:
            continue
        path, kind = stack[-1][0], getattr(stack[-1][1], "__name__", str(stack[-1][1]))
        if kind in kinds:
            container = container_label(re.sub(r"\.\d+$", "", path))
            repeats[f"{container}.* ({kind}, {body.nodes} nodes)"] = (len(body_calls), body)
    return repeats

