"""Own ``functionalize``: remove every mutation from ``main`` and record it in the signature.

The captured graph is re-traced with ``make_fx`` under ``FunctionalTensorMode`` (as AOT
Autograd does). Graphs with ``no_grad`` regions are traced at the pre-dispatch level so those
regions survive for the joint trace; others (and functorch programs) post-dispatch. Input mutations (``x.add_()`` on an input, BatchNorm running stats, ``t_()``) become
leading ``mutation`` outputs; the runtime wrapper writes them back.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule

from passkit import _torch
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.autodiff.hidden_writes import HiddenWrites, find_hidden_writes
from passkit.autodiff.subclasses import CAPTURED_SOURCE
from passkit.core.program import Desc, GraphIO, Program

__all__ = ["functionalize"]


class _ForwardInterpreter(torch.fx.Interpreter):
    """Main as the user wrote it: a higher-order op's autograd rule is ``joint``'s to apply."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        return _torch.call_keeping_whole(target, args, kwargs)


def _interpreted(gm: GraphModule) -> Any:
    def run(*args: Any) -> Any:
        return _ForwardInterpreter(gm).run(*args)

    return run


@graph_pass("functionalize", produces={"functional"})
def functionalize(program: Program) -> bool:
    """Re-trace main without mutations; record input mutations and aliases in the signature."""
    main = program.graphs["main"]
    io = program.io("main")
    if any(d.kind == "mutation" for d in io.outputs) or "functional" in program.facts:
        # Already functional: its mutations are outputs, or a step (passkit.export's, for the
        # program passkit.to_executorch is handed) made it so. A second trace would only reorder
        # nodes, which XNNPACK's pattern-based linear conversion does not survive (Llama).
        return False
    names = [n.name for n in main.graph.nodes if n.op == "placeholder"]
    hidden = HiddenWrites()
    if program.training:
        requires_grad = [info.requires_grad for info in program.signature.inputs]
        hidden = find_hidden_writes(main, list(program.example_inputs), requires_grad, program.fake_mode)
        if CAPTURED_SOURCE not in program.notes:  # capture keeps the graph for joint where it found one
            hidden.refuse()
    # oneDNN's fused LSTM layer leaves its backward's workspace empty when the compiled forward
    # runs without grad mode; ATen's unfused cells compute the same values (see joint's forms).
    with _torch.mkldnn_disabled():
        gm, mutations = _torch.functional_trace(
            _interpreted(main),
            program.example_inputs,
            pre_dispatch=_torch.keeps_grad_mode_regions(main),
            arg_names=names,
        )
    gm.graph.eliminate_dead_code(is_impure_node=_torch.is_impure)
    gm.recompile()
    for mutation in mutations:
        info = program.signature.inputs[mutation.index]
        info.mutates_data = mutation.data
        info.mutates_metadata = mutation.metadata
        # Written only through ``detach()`` counts as under no_grad: the history stays the old one.
        info.mutated_under_no_grad = mutation.under_no_grad or mutation.index in hidden.inputs
    outputs = [Desc("mutation", m.index) for m in mutations] + list(io.outputs)
    program.set_graph("main", gm, GraphIO(inputs=list(io.inputs), outputs=outputs))
    program.record_stat("mutated_inputs", len(mutations))
    return True


@hookimpl
def passkit_register_passes() -> list:
    return [functionalize]

