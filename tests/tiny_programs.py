"""A hand-built program for runner and instrument tests: ``main(x, y) = (x + y) * y``."""

from __future__ import annotations

import torch
from torch import fx

from passkit.program import GraphIO, Program, Signature

aten = torch.ops.aten


def make_program(*, mutating: bool = False, dead: bool = False, training: bool = False) -> Program:
    """The add is in place when ``mutating``; ``dead`` adds a node nobody reads."""
    graph = fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    if dead:
        graph.call_function(aten.neg.default, (x,))
    total = graph.call_function(aten.add_.Tensor if mutating else aten.add.Tensor, (x, y))
    graph.output(graph.call_function(aten.mul.Tensor, (total, y)))
    gm = fx.GraphModule(torch.nn.Module(), graph)
    signature = Signature(inputs=[], outputs=[], graph_io={"main": GraphIO([], [])})
    return Program(graphs={"main": gm}, signature=signature, example_inputs=[], facts={"captured"}, training=training)
