"""Own ``joint``: trace forward and backward into one graph.

The joint graph's inputs are the primals (``primals_N``) and one tangent per output that needs
grad (``tangents_N``); its outputs are main's outputs followed by one gradient per input that
requires grad. ``torch.autograd.grad`` is traced inside ``make_fx``; when the backward comes out
with in-place ops, the trace is repeated under functionalization, so the result is functional.

A leaf that requires grad and is mutated under ``no_grad`` stays the leaf in eager: later uses
of its new value send their gradient to it. The joint trace reproduces that by treating the new
value as a second leaf and adding its gradient to the input's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.hookspecs import hookimpl
from passkit.pass_api import graph_pass
from passkit.program import Desc, GraphIO, Program

__all__ = ["joint", "make_joint_fn", "JointPlan"]


def _differentiable_copy(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return torch.empty_like(dst).copy_(src, non_blocking=non_blocking)


# Functionalization emits these functional ops, which have no autograd formula; under autograd
# they run as an equivalent that has one.
_DIFFERENTIABLE_FORMS: dict[Any, Any] = {torch.ops.aten.copy.default: _differentiable_copy}


def _differentiable_form(target: Any) -> Any:
    return _DIFFERENTIABLE_FORMS.get(target, target)


class _LeafInterpreter(torch.fx.Interpreter):
    """Run main under autograd, turning chosen nodes' values into fresh autograd leaves."""

    def __init__(self, gm: GraphModule, leaf_nodes: dict[Node, int]) -> None:
        super().__init__(gm)
        self.leaf_nodes = leaf_nodes
        self.leaves: list[tuple[int, torch.Tensor]] = []

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        return super().call_function(_differentiable_form(target), args, kwargs)

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        if n in self.leaf_nodes:
            value = value.detach().requires_grad_(True)
            self.leaves.append((self.leaf_nodes[n], value))
        return value


class JointPlan:
    """Which outputs get tangents and which inputs get gradients, for one functional main."""

    def __init__(self, program: Program) -> None:
        self.main = program.graphs["main"]
        self.io = program.io("main")
        inputs = program.signature.inputs
        self.grad_inputs = [i for i, info in enumerate(inputs) if info.requires_grad]
        output_node = next(n for n in reversed(self.main.graph.nodes) if n.op == "output")
        self.leaf_nodes = {
            output_node.args[0][k]: d.index
            for k, d in enumerate(self.io.outputs)
            if d.kind == "mutation" and inputs[d.index].requires_grad and inputs[d.index].mutated_under_no_grad
        }
        with program.fake_mode, torch.enable_grad():
            outs = _LeafInterpreter(self.main, self.leaf_nodes).run(*program.example_inputs)
        self.diff_outputs = [
            k
            for k, out in enumerate(outs)
            if isinstance(out, torch.Tensor) and out.requires_grad and out.is_floating_point()
        ]
        with program.fake_mode:
            self.tangent_examples = [torch.empty_like(outs[k]) for k in self.diff_outputs]


def make_joint_fn(plan: JointPlan) -> Any:
    """``f(*primals, *tangents) -> (*main outputs, *grads of inputs that require grad)``."""
    n_primals = len(plan.io.inputs)

    def joint_fn(*flat: Any) -> tuple[Any, ...]:
        primals, tangents = flat[:n_primals], flat[n_primals:]
        interpreter = _LeafInterpreter(plan.main, plan.leaf_nodes)
        with torch.enable_grad():
            outs = interpreter.run(*primals)
        wrt = [primals[i] for i in plan.grad_inputs] + [leaf for _, leaf in interpreter.leaves]
        grads = list(
            torch.autograd.grad(
                [outs[k] for k in plan.diff_outputs], wrt, list(tangents), allow_unused=True
            )
        )
        input_grads = grads[: len(plan.grad_inputs)]
        for (index, _), extra in zip(interpreter.leaves, grads[len(plan.grad_inputs) :]):
            slot = plan.grad_inputs.index(index)
            if extra is not None:
                input_grads[slot] = extra if input_grads[slot] is None else input_grads[slot] + extra
        return (*outs, *input_grads)

    return joint_fn


def _tag_forward_and_backward(gm: GraphModule, n_forward_outputs: int) -> None:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    forward: set[Node] = set()
    stack = [a for a in output.args[0][:n_forward_outputs] if isinstance(a, Node)]
    while stack:
        node = stack.pop()
        if node in forward:
            continue
        forward.add(node)
        stack.extend(node.all_input_nodes)
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "output"):
            node.meta["partitioner_tag"] = "is_forward" if node in forward else "is_backward"


def _lowering_table(program: Program) -> dict[Any, Any] | None:
    """The table an earlier ``decompose`` step lowered through, so the backward matches."""
    target = program.notes.get("target_opset")
    return target.table() if target is not None else None


@graph_pass("joint", requires={"functional"}, produces={"joint"}, training_only=True)
def joint(program: Program) -> bool:
    """Trace forward and backward into one graph of primals and tangents."""
    plan = JointPlan(program)
    names = [f"primals_{i + 1}" for i in range(len(plan.io.inputs))]
    names += [f"tangents_{k + 1}" for k in range(len(plan.diff_outputs))]
    args = [*program.example_inputs, *plan.tangent_examples]
    table = _lowering_table(program)
    # Most backward formulas are out-of-place, and the plain trace is cheaper; a graph that came
    # out with in-place ops is traced again under functionalization.
    gm = _torch.trace_graph(make_joint_fn(plan), args, pre_dispatch=False, decompositions=table, arg_names=names)
    if _torch.has_mutations(gm):
        gm, mutations = _torch.functional_trace(
            make_joint_fn(plan), args, pre_dispatch=False, decompositions=table, arg_names=names
        )
        if mutations:
            raise RuntimeError(f"joint trace mutated its inputs: {mutations}")
    gm.graph.eliminate_dead_code()
    _tag_forward_and_backward(gm, len(plan.io.outputs))
    gm.recompile()
    io = GraphIO(
        inputs=list(plan.io.inputs) + [Desc("tangent", k) for k in plan.diff_outputs],
        outputs=list(plan.io.outputs) + [Desc("grad", i) for i in plan.grad_inputs],
    )
    program.drop_graph("main")
    program.set_graph("joint", gm, io)
    program.record_stat("tangents", len(plan.diff_outputs))
    return True


@hookimpl
def passkit_register_passes() -> list:
    return [joint]
