"""Own differentiating a functional ``main``: the joint function of primals and tangents.

``make_joint_fn(JointPlan(program))`` is ``f(*primals, *tangents) -> (*outputs, *grads)``. The
``joint`` pass traces it into a graph; numerics verification runs it on real tensors to observe
what a functional program computes. A leaf that requires grad and is mutated under ``no_grad``
stays the leaf in eager: later uses of its new value send their gradient to it. The joint
function reproduces that by treating the new value as a second leaf and adding its gradient to
the input's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.autodiff.differentiable_forms import DIFFERENTIABLE_FORMS
from passkit.core.program import Program

__all__ = ["JointPlan", "make_joint_fn"]


class _CopyInto(torch.autograd.Function):
    """``dst.copy_(src)`` differentiated as eager does: zeros for the overwritten ``dst``.

    Without it, a gradient that reaches an input only through overwritten values is missing
    (``None``) where eager gives zeros (``linalg.matrix_power(x, 0)`` copies ``eye`` into a
    clone of ``x``).
    """

    @staticmethod
    def forward(ctx: Any, dst: torch.Tensor, src: Any, non_blocking: bool) -> torch.Tensor:  # type: ignore[override]
        ctx.src_shape = tuple(src.shape) if isinstance(src, torch.Tensor) else None
        ctx.src_dtype = src.dtype if isinstance(src, torch.Tensor) else None
        return torch.empty_like(dst).copy_(src, non_blocking=non_blocking)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grad_dst = torch.zeros_like(grad) if ctx.needs_input_grad[0] else None
        grad_src = None
        if ctx.needs_input_grad[1]:
            grad_src = grad.real if grad.is_complex() and not ctx.src_dtype.is_complex else grad
            grad_src = grad_src.to(ctx.src_dtype).sum_to_size(ctx.src_shape)
        return grad_dst, grad_src, None


def _differentiable_copy(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    if isinstance(dst, torch.Tensor) and dst.requires_grad:
        return _CopyInto.apply(dst, src, non_blocking)
    return torch.empty_like(dst).copy_(src, non_blocking=non_blocking)


# Functionalization emits these functional ops, which have no autograd formula; under autograd
# they run as an equivalent that has one.
_DIFFERENTIABLE_FORMS: dict[Any, Any] = {torch.ops.aten.copy.default: _differentiable_copy, **DIFFERENTIABLE_FORMS}


def _differentiable_form(target: Any) -> Any:
    return _DIFFERENTIABLE_FORMS.get(target, target)


class _LeafInterpreter(torch.fx.Interpreter):
    """Run main under autograd, turning chosen nodes' values into fresh autograd leaves."""

    def __init__(self, gm: GraphModule, leaf_nodes: dict[Node, int],
                 region_grads: dict[str, list[bool]] | None = None) -> None:
        super().__init__(gm)
        self.leaf_nodes = leaf_nodes
        self.leaves: list[tuple[int, torch.Tensor]] = []
        # Without ``region_grads`` the run notes which operands of each region body need grad;
        # with it, every call of a body differentiates those operands (``_torch.regions``).
        self.noting = region_grads is None
        self.region_grads: dict[str, list[bool]] = {} if region_grads is None else region_grads

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if self.noting:
            _torch.region_operands_needing_grad(target, args, self.region_grads)
        else:
            args = _torch.region_operands_differentiated(target, args, self.region_grads)
        # An outlined region's body keeps its values' layouts as this graph does (below).
        args = _torch.bodies_keeping_layout(target, args)
        return super().call_function(_differentiable_form(target), args, kwargs)

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        if n.op == "call_function":
            # A decomposition applied here (``joint`` lowers ops with their own autograd formula)
            # may lay its result out otherwise than the op main recorded, whose ``view``
            # nodes rely on that layout: Inductor's ``cat`` of an empty past and one tensor
            # returns that tensor's transposed strides.
            value = _torch.with_layout(value, n.meta.get("val"))
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
        # torch 2.11 traces region bodies in the tracing context's fake mode (Dynamo's, while a
        # backend compiles), not the operands': ``in_fake_mode`` names the program's there.
        with _torch.in_fake_mode(program.fake_mode), torch.enable_grad(), _torch.subgraph_grads_by_running(self.main), \
                _torch.region_schemas_remembered():
            noting = _LeafInterpreter(self.main, self.leaf_nodes)
            outs = noting.run(*program.example_inputs)
        self.region_grads = noting.region_grads
        # A user output the traced function left without grad (a gradient computed inside it
        # with ``torch.autograd.grad``) stays without, although the graph computes it from inputs.
        user_requires_grad = {
            k: program.signature.outputs[d.index].requires_grad for k, d in enumerate(self.io.outputs) if d.kind == "user"
        }
        self.diff_outputs = [
            k
            for k, out in enumerate(outs)
            if isinstance(out, torch.Tensor)
            and out.requires_grad
            and (out.is_floating_point() or out.is_complex())
            and user_requires_grad.get(k, True)
        ]
        with program.fake_mode:
            self.tangent_examples = [torch.empty_like(outs[k]) for k in self.diff_outputs]


def make_joint_fn(plan: JointPlan) -> Any:
    """``f(*primals, *tangents) -> (*main outputs, *grads of inputs that require grad)``."""
    n_primals = len(plan.io.inputs)

    def joint_fn(*flat: Any) -> tuple[Any, ...]:
        primals, tangents = flat[:n_primals], flat[n_primals:]
        interpreter = _LeafInterpreter(plan.main, plan.leaf_nodes, plan.region_grads)
        traceable = _torch.loop_backwards_traceable(plan.main, primals)
        with _torch.subgraph_grads_by_running(plan.main), traceable:
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
