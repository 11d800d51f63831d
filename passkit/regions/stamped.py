"""Own the refusal of a Dynamo graph whose stamped-out region call reads another layer's weights.

Dynamo traces a function marked with ``torch.compiler.nested_compile_region`` once and stamps the
trace out for every later call whose inputs match. In torch 2.13 a mark bound to each instance
(``layer.forward = types.MethodType(marked, layer)``) is stamped out with the parameters of the
first layer traced: every later layer's call reads that layer's weights, its own never reach
the graph, and outputs differ from eager's under every backend, ``aot_eager`` and ``inductor``
included. The graph passkit receives is already wrong, so no pass can repair it. A call of an
indexed layer (``blocks.2``) that reads parameters of a sibling (``blocks.1``) and none of its
own is that case, and is refused in one line whatever ``on_error`` says: passkit's eager
fallback runs Dynamo's graph, the wrong one. Marking the class's ``forward``, as torch
documents, is traced right and passes.
"""

from __future__ import annotations

import re

import torch
from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.errors import PasskitError

__all__ = ["StampedRegionError", "refuse_regions_reading_other_layers"]

# "blocks.2" -> ("blocks", "2"): the layer's container and its index.
_INDEXED = re.compile(r"^(?P<container>.+)\.(?P<index>\d+)$")
_LOCAL = re.compile(r"^L\['([^']+)'\]")


class StampedRegionError(PasskitError):
    """Dynamo's graph calls a region with another layer's parameters."""


def refuse_regions_reading_other_layers(gm: GraphModule) -> None:
    """Raise ``StampedRegionError`` when a region call of one indexed layer reads a sibling
    layer's parameters or buffers and none of its own."""
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    if hop is None:
        return
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    names = dict(zip(placeholders, _torch.dynamo_input_names(gm)))
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not hop:
            continue
        layer = _layer_path(node)
        match = _INDEXED.match(layer or "")
        if layer is None or match is None:
            continue
        state = [names[arg][0] for arg in node.args[2:] if isinstance(arg, Node) and arg in names and names[arg][1]]
        if not state or any(name.startswith(f"{layer}.") for name in state):
            continue
        sibling = re.compile(rf"^{re.escape(match.group('container'))}\.\d+\.")
        other = next((name for name in state if sibling.match(name)), None)
        if other is not None:
            raise StampedRegionError(
                f"passkit: Dynamo's region call for layer {layer} reads {other}, another layer's "
                "parameter, and none of its own (torch stamps out a nested_compile_region bound to each "
                "instance with the first layer's parameters); mark the class's forward with "
                "@torch.compiler.nested_compile_region instead"
            )


def _layer_path(node: Node) -> str | None:
    """The innermost module on the call's ``nn_module_stack``, named as input names are
    (``L['self'].blocks.2`` -> ``self.blocks.2``)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path = str(list(stack.values())[-1][0])
    return _LOCAL.sub(r"\1", path)
