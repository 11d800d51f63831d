"""Own numerics checks: running a program at any stage on real inputs and comparing to capture.

What is compared is what a user can observe: the user outputs, the final values of the inputs
(mutations), and for a training program the gradients of the inputs that require grad, under
fixed seeded cotangents. ``verify = "numerics"`` builds a ``Reference`` from the captured
program and asks it after every step whether the current graphs still agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from passkit._torch import concrete, dynamo_input_names, higher_order_ops_on_real_tensors, subgraph_grads_by_running
from passkit.autodiff.plain import JointPlan, make_joint_fn
from passkit.verify.compare import DEFAULT_TOLERANCE, compare_values, initialised_cuda, same_random_draws
from passkit.autodiff.subclasses import CAPTURED_SOURCE, SubclassJoint
from passkit.core.program import Program

__all__ = ["Observation", "Reference", "observe"]


@dataclass
class Observation:
    outputs: list[Any]
    inputs: list[Any]
    grads: list[Any]


def _clone_inputs(real_inputs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Fresh copies of the inputs, plus the leaves that gradients are taken against."""
    clones, leaves = [], []
    for value in real_inputs:
        if not isinstance(value, torch.Tensor):
            clones.append(value)
            leaves.append(None)
            continue
        leaf = value.detach().clone().requires_grad_(value.requires_grad)
        leaves.append(leaf if value.requires_grad else None)
        clones.append(leaf.clone() if value.requires_grad and not value.is_leaf else leaf)
    return clones, leaves


def _cotangent(value: torch.Tensor, seed: int) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(value.shape, generator=generator, dtype=value.dtype).to(value.device)


def output_cotangent(value: torch.Tensor, index: int) -> torch.Tensor:
    """The seeded gradient every numerics check sends into the program's output ``index``
    (standard normal, one seed per output): ``verify``, ``passkit run`` and bisect alike."""
    return _cotangent(value, 1000 + index)


def _user_cotangents(program: Program, outputs: Sequence[Any]) -> list[Any]:
    return [
        output_cotangent(out, j) if info.requires_grad and isinstance(out, torch.Tensor) else None
        for j, (info, out) in enumerate(zip(program.signature.outputs, outputs))
    ]


def observe(program: Program, real_inputs: Sequence[Any]) -> Observation:
    """Run the program's current graphs (whatever stage they are at) on copies of the inputs.

    Random ops follow ``passkit.verify.compare.same_random_draws``: every stage draws the same
    numbers, and the caller's RNG state is restored afterwards.
    """
    with same_random_draws(), higher_order_ops_on_real_tensors(program.graphs.values()):
        return _observe(program, real_inputs)


def _observe(program: Program, real_inputs: Sequence[Any]) -> Observation:
    clones, leaves = _clone_inputs(real_inputs)
    graphs = program.graphs
    if "forward" in graphs:
        return _observe_split(program, clones, leaves)
    if "joint" in graphs:
        return _observe_joint(program, clones, leaves)
    io = program.io("main")
    source = program.notes.get(CAPTURED_SOURCE)
    # Over plain inputs, main run with autograd is eager itself until a step re-traces it.
    if source is not None and program.training and program.graphs["main"] is not source.captured_main:
        return _observe_subclass_main(program, clones, source)
    if not any(d.kind == "mutation" for d in io.outputs) and "functional" not in program.facts:
        return _observe_eager(program, clones, leaves)
    if not program.training:
        with torch.no_grad():
            outs = graphs["main"](*clones)
        return _finish(program, io.outputs, list(outs), clones, grads=[])
    plan = JointPlan(program)
    # The probe only learns output shapes; it must not consume the random numbers that the joint
    # run draws, or a model with dropout would differ from the capture at this stage alone.
    with torch.no_grad(), torch.random.fork_rng(devices=initialised_cuda()):
        probe = graphs["main"](*[c.detach() if isinstance(c, torch.Tensor) else c for c in clones])
    tangents = _tangents_for(program, io.outputs, plan.diff_outputs, probe)
    results = make_joint_fn(plan)(*clones, *tangents)
    n_out = len(io.outputs)
    return _finish(program, io.outputs, list(results[:n_out]), clones, _grads(program, plan.grad_inputs, results[n_out:]))


def _observe_subclass_main(program: Program, clones: list[Any], source: Any) -> Observation:
    """Main's outputs, and gradients taken at the subclass level, as ``joint`` takes them.

    Differentiating the flat main would miss what the subclass decides a gradient is (a
    ``DTensor``'s backward runs its own collectives).
    """
    io = program.io("main")
    plan = SubclassJoint(program, source)
    primals = [c.detach() if isinstance(c, torch.Tensor) else c for c in clones]
    with torch.no_grad(), torch.random.fork_rng(devices=initialised_cuda()):
        outs = list(program.graphs["main"](*primals))
    tangents = _tangents_for(program, io.outputs, plan.diff_outputs, outs)
    results = plan(*primals, *tangents)
    n_out = len(results) - len(plan.grad_inputs)
    return _finish(program, io.outputs, outs, primals, _grads(program, plan.grad_inputs, results[n_out:]))


def _observe_eager(program: Program, clones: list[Any], leaves: list[Any]) -> Observation:
    with subgraph_grads_by_running(program.graphs["main"]):
        with torch.set_grad_enabled(program.training):
            outs = list(program.graphs["main"](*clones))
        grads: list[Any] = []
        if program.training:
            cotangents = _user_cotangents(program, outs)
            pairs = [(o, c) for o, c in zip(outs, cotangents) if c is not None]
            wrt = [leaf for leaf in leaves if leaf is not None]
            found = torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs], allow_unused=True)
            grads = [g.detach() if g is not None else None for g in found]
    return Observation([_detached(o) for o in outs], [_detached(c) for c in clones], grads)


def _tangents_for(program: Program, outputs: Sequence[Any], diff_positions: Sequence[int], values: Any) -> list[Any]:
    """Seeded cotangents for user outputs that need grad; zeros for the other differentiable outputs."""
    tangents = []
    for k in diff_positions:
        desc = outputs[k]
        value = values[k]
        if desc.kind == "user" and program.signature.outputs[desc.index].requires_grad:
            tangents.append(output_cotangent(value, desc.index))
        else:
            tangents.append(torch.zeros_like(value))
    return tangents


def _observe_joint(program: Program, clones: list[Any], leaves: list[Any]) -> Observation:
    io = program.io("joint")
    fn = program.compiled.get("joint", program.graphs["joint"])
    primals = [c.detach() if isinstance(c, torch.Tensor) else c for c in clones]
    n_fwd = io.n_visible
    diff = [d.index for d in io.inputs if d.kind == "tangent"]
    placeholders = [n for n in program.graphs["joint"].graph.nodes if n.op == "placeholder"]
    shapes = {d.index: p.meta["val"] for p, d in zip(placeholders, io.inputs) if d.kind == "tangent"}
    with torch.no_grad():
        probe = {k: torch.zeros([concrete(d) for d in v.shape], dtype=v.dtype) for k, v in shapes.items()}
        tangents = _tangents_for(program, io.outputs[:n_fwd], diff, probe)
        results = list(fn(*primals, *tangents))
    grad_targets = [d.index for d in io.outputs[n_fwd:]]
    return _finish(program, io.outputs[:n_fwd], results[:n_fwd], primals, _grads(program, grad_targets, results[n_fwd:]))


def _observe_split(program: Program, clones: list[Any], leaves: list[Any]) -> Observation:
    fw_io, bw_io = program.io("forward"), program.io("backward")
    forward = program.compiled.get("forward", program.graphs["forward"])
    backward = program.compiled.get("backward", program.graphs["backward"])
    primals = [c.detach() if isinstance(c, torch.Tensor) else c for c in clones]
    with torch.no_grad():
        outs = list(forward(*primals))
        n_fwd = fw_io.n_visible
        visible, saved = outs[:n_fwd], outs[n_fwd:]
        diff = [d.index for d in bw_io.inputs if d.kind == "tangent"]
        tangents = dict(zip(diff, _tangents_for(program, fw_io.outputs[:n_fwd], diff, visible)))
        args = [saved[d.index] if d.kind == "saved" else tangents[d.index] for d in bw_io.inputs]
        grads = list(backward(*args))
    targets = [d.index for d in bw_io.outputs]
    return _finish(program, fw_io.outputs[:n_fwd], visible, primals, _grads(program, targets, grads))


def _grads(program: Program, targets: Sequence[int], values: Sequence[Any]) -> list[Any]:
    by_input = dict(zip(targets, values))
    return [
        _detached(by_input.get(i))
        for i, info in enumerate(program.signature.inputs)
        if info.requires_grad
    ]


def _finish(program: Program, descs: Sequence[Any], values: Sequence[Any], clones: list[Any], grads: list[Any]) -> Observation:
    final_inputs = list(clones)
    user: dict[int, Any] = {}
    for desc, value in zip(descs, values):
        if desc.kind == "mutation":
            if value is not None:  # None: the compiled graph wrote the input itself (codegen.inductor)
                final_inputs[desc.index] = value
        elif desc.kind == "user":
            user[desc.index] = value
    outputs = [_detached(user.get(j)) for j in range(len(program.signature.outputs))]
    return Observation(outputs, [_detached(v) for v in final_inputs], grads)


def _detached(value: Any) -> Any:
    return value.detach() if isinstance(value, torch.Tensor) else value


def _source_graph(program: Program, label: str) -> str:
    """The graph that computes outputs and new input values (forward), or gradients (backward)."""
    if "forward" in program.graphs:
        return "backward" if label == "grad" else "forward"
    return next(iter(program.graphs))


def grad_names(program: Program) -> list[str] | None:
    """The name of each gradient as the user's code names what it is the gradient of
    (``norm2.weight``, ``x``), as ``passkit run`` names them; None where the captured graph does
    not say (a program read back from a file: gradients are then numbered)."""
    main = program.graphs.get("main")
    if main is None:
        return None
    try:
        names = dynamo_input_names(main)
    except Exception:  # noqa: BLE001 - a name is a nicety: numbering stays correct
        return None
    inputs = program.signature.inputs
    if len(names) != len(inputs) or not any("grapharg" in n.meta for n in main.graph.nodes if n.op == "placeholder"):
        return None
    # A parameter's name starts with the local that holds its module (self; fn under the wrapper
    # torch puts around nn.Sequential): run names it as named_parameters() does, without it.
    return [name.split(".", 1)[1] if state and "." in name else name
            for (name, state), info in zip(names, inputs) if info.requires_grad]


class Reference:
    """What the captured program computes on the real example inputs."""

    def __init__(self, program: Program, real_inputs: Sequence[Any]) -> None:
        self.real_inputs = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) and x.is_leaf else x for x in real_inputs]
        self.expected = observe(program, self.real_inputs)
        # Named while the graph still holds Dynamo's record of each input's source.
        self.grad_names = grad_names(program)

    def compare(self, program: Program, tolerance: tuple[float, float] = DEFAULT_TOLERANCE) -> str | None:
        """None when the program's current graphs agree with capture within ``tolerance``
        (``passkit.verify.compare.tolerance_for``); else where they deviate and the tolerance held to."""
        actual = observe(program, self.real_inputs)
        for label, expected, got in (
            ("output", self.expected.outputs, actual.outputs),
            ("input", self.expected.inputs, actual.inputs),
            ("grad", self.expected.grads, actual.grads),
        ):
            names = self.grad_names if label == "grad" and self.grad_names is not None else None
            if names is not None and len(names) != len(expected):
                names = None
            comparison = compare_values(expected, got, label, tolerance, names=names)
            if not comparison.ok:
                first = comparison.mismatches[0]
                return f"{first.why} in {first.where} of graph {_source_graph(program, label)} ({first.tolerance})"
        return None
