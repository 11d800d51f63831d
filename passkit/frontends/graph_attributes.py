"""Own lifting the tensors Dynamo leaves on its graph as attributes into program inputs.

Dynamo hands a compiled optimizer step its parameters (``nn.Parameter``) and its state
(``exp_avg``, ``momentum_buffer``, ``step``: registered buffers) as attributes of the graph,
read with ``get_attr``; only the gradients are placeholders. A program's mutations are
recorded and written back per input, so each such tensor becomes a leading placeholder, as
torch's ``aot_module_simplified`` lifts a graph's parameters and buffers, and the callable
handed back to Dynamo passes the same tensor objects on every call. The step then updates
them in place, as eager does. Other attributes (Dynamo's constants) stay constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.fx import Graph, GraphModule, Node

__all__ = ["LiftedAttributes", "lift_attributes"]


@dataclass
class LiftedAttributes:
    """The tensors lifted out of a graph, in placeholder order, and how to pass them back."""

    tensors: list[torch.Tensor] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)

    def bind(self, compiled: Callable[..., Any]) -> Callable[..., Any]:
        """``compiled`` as Dynamo calls it: with the graph's own inputs only."""
        if not self.tensors:
            return compiled
        lifted = tuple(self.tensors)

        def with_attributes(*args: Any) -> Any:
            return compiled(*lifted, *args)

        with_attributes.passkit_compiled = compiled  # type: ignore[attr-defined]
        return with_attributes


def lift_attributes(gm: GraphModule) -> tuple[GraphModule, LiftedAttributes]:
    """A copy of ``gm`` whose reads of its parameters and buffers are leading placeholders.

    ``gm`` itself is left as it is: on ``on_error = "eager"`` Dynamo's graph runs as it came.
    One tensor reached under two names becomes one input, so its mutations are written back
    once. Without such reads, ``gm`` comes back unchanged.
    """
    registered = _registered_tensors(gm)
    reads = [n for n in gm.graph.nodes if n.op == "get_attr" and n.target in registered]
    lifted = LiftedAttributes()
    if not reads:
        return gm, lifted
    graph = Graph()
    val_map: dict[Node, Node] = {}
    by_tensor: dict[int, Node] = {}
    for node in reads:
        value, kind = registered[str(node.target)]
        placeholder = by_tensor.get(id(value))
        if placeholder is None:
            placeholder = graph.placeholder("attr_" + str(node.target).replace(".", "_"))
            placeholder.meta.update({k: v for k, v in node.meta.items() if k in ("example_value", "val", "tensor_meta")})
            by_tensor[id(value)] = placeholder
            lifted.tensors.append(value)
            lifted.kinds.append(kind)
        val_map[node] = placeholder
    graph.output(graph.graph_copy(gm.graph, val_map))
    lifted_gm = GraphModule(gm, graph)  # copies only the attributes still read (constants)
    lifted_gm.meta.update(gm.meta)
    return lifted_gm, lifted


def _registered_tensors(gm: GraphModule) -> dict[str, tuple[torch.Tensor, str]]:
    tensors = {name: (value, "param") for name, value in gm.named_parameters(remove_duplicate=False)}
    tensors.update({name: (value, "buffer") for name, value in gm.named_buffers(remove_duplicate=False)})
    return tensors
