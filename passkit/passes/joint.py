"""Own ``joint``: trace forward and backward into one graph.

The joint graph's inputs are the primals (``primals_N``) and one tangent per output that needs
grad (``tangents_N``); its outputs are main's outputs followed by one gradient per input that
requires grad. The joint function (``passkit.autodiff.plain``) is traced inside ``make_fx``; when the
backward comes out with in-place ops, the trace is repeated under functionalization, so the
result is functional. The bodies of ``invoke_subgraph`` calls are split into forward and backward
here, once per body, by passkit's min-cut (``partition_min_cut.body_partition``) unless the
step asks for torch's.
"""

from __future__ import annotations

from typing import Any, Literal

from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.autodiff.plain import JointPlan, make_joint_fn
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.passes.decompose import out_of_place_table
from passkit.passes.partition_min_cut import MinCutOptions, body_partition
from passkit.core.program import Desc, GraphIO, Program
from passkit.errors import PasskitError
from passkit.autodiff.subclasses import CAPTURED_SOURCE, SubclassJoint

__all__ = ["BACKWARD_MUTATES_INPUT_METADATA", "BACKWARD_MUTATES_TANGENT_METADATA", "joint"]

# torch's AOT Autograd refuses these in the same words (``graph_capture_wrappers.py``).
BACKWARD_MUTATES_INPUT_METADATA = (
    "Found a graph input that had its metadata mutated in the backward. This is not supported"
)
BACKWARD_MUTATES_TANGENT_METADATA = (
    "Found an input to the backward that had metadata mutated during the backward pass. This is not supported"
)


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


def _lowering_table(program: Program) -> Any:
    """The table an earlier ``decompose`` step lowered through, so the backward matches (the
    step's own, shared: never changed here)."""
    target = program.target_opset
    return target.table if target is not None else None


def _refuse(program: Program, mutations: list[Any]) -> None:
    """Refuse a joint whose trace wrote to its inputs: the metadata of a primal the forward leaves
    alone (a custom backward's ``b.transpose_``) or of a tangent in torch's words, naming the input."""
    io = program.io("main")
    inputs = program.signature.inputs
    for mutation in mutations:
        if not mutation.metadata:
            continue
        if mutation.index >= len(io.inputs):
            raise PasskitError(f"{BACKWARD_MUTATES_TANGENT_METADATA} (the gradient of output {mutation.index - len(io.inputs)})")
        desc = io.inputs[mutation.index]
        if not inputs[desc.index].mutates_metadata:
            raise PasskitError(f"{BACKWARD_MUTATES_INPUT_METADATA} (input {desc.index}, {inputs[desc.index].name})")
    raise RuntimeError(f"joint trace mutated its inputs: {mutations}")


@graph_pass("joint", requires={"functional"}, produces={"joint"}, training_only=True)
def joint(program: Program, *, bodies: Literal["min_cut", "torch_min_cut"] = "min_cut",
          bodies_fused_pointwise: bool = False) -> bool:
    """Trace forward and backward into one graph of primals and tangents.

    ``bodies`` picks the partitioner that splits each outlined region's body: passkit's
    ``partition.min_cut`` (with no memory limit; ``bodies_fused_pointwise`` as its
    ``fused_pointwise``) or torch's own min-cut.
    """
    # A program over tensor subclasses is differentiated at their level (``subclass_autodiff``).
    source = program.notes.get(CAPTURED_SOURCE)
    plan = JointPlan(program) if source is None else SubclassJoint(program, source)
    io = program.io("main")
    attention_changed = _torch.attention_statistics_kept(program.graphs["main"])
    names = [f"primals_{i + 1}" for i in range(len(io.inputs))]
    names += [f"tangents_{k + 1}" for k in range(len(plan.diff_outputs))]
    args = [*program.example_inputs, *plan.tangent_examples]
    joint_fn = make_joint_fn(plan) if source is None else plan
    table = _lowering_table(program)
    # Most backward formulas are out-of-place, and the plain trace is cheaper; a graph that came
    # out with in-place ops is traced again under functionalization. The plain trace leaves
    # mutating ops whole: a decomposition registered for an ``out=`` overload may not take
    # ``out`` (``mm.out`` in Inductor's table, called by linear_cross_entropy's backward), and
    # functionalization turns such an op into its functional form before the table sees it.
    plain_table = None if table is None else out_of_place_table(table)
    gm = _torch.trace_graph(joint_fn, args, pre_dispatch=False, decompositions=plain_table, arg_names=names)
    if _torch.has_mutations(gm):
        gm, mutations = _torch.functional_trace(
            joint_fn, args, pre_dispatch=False, decompositions=None if table is None else dict(table), arg_names=names
        )
        if any(m.metadata or m.index < len(io.inputs) for m in mutations):
            _refuse(program, mutations)
        if mutations:
            # Only tangents' data were written: a custom backward that writes into the gradient
            # it is given (``return g.mul_(2)``). The graph goes on with the written value; the
            # gradient buffer is autograd's, read by nothing afterwards, so no write-back.
            output = next(node for node in gm.graph.nodes if node.op == "output")
            output.args = (tuple(output.args[0][len(mutations):]),)
    gm.graph.eliminate_dead_code(is_impure_node=_torch.is_impure)
    if source is not None:
        _torch.clone_lifted_constants(gm)
        # Steps before this one shaped main, which the joint does not trace: the report says so.
        program.record_stat("differentiated", f"the captured graph ({source.reason})")
    # torch's autograd rule for ``invoke_subgraph`` (the user's ``nested_compile_region``, the
    # ``regions`` pass) puts a body's whole joint in its backward call, which recomputes the
    # forward there and draws new dropout masks; each body is split once into a forward that also
    # returns what its backward needs and a backward that reads those, as torch's AOT path does.
    partition = body_partition(MinCutOptions(fused_pointwise=bodies_fused_pointwise)) if bodies == "min_cut" else None
    bodies_split = _torch.partition_region_bodies(gm, partition)
    # torch gives every call of a body the body's own output values; a later re-trace (Inductor's
    # decompositions in codegen.inductor) would then read one call's saved values for all.
    _torch.operands_read_directly(gm)
    _torch.region_results_of_their_own(gm)
    _tag_forward_and_backward(gm, len(io.outputs))
    gm.recompile()
    io = GraphIO(
        inputs=list(io.inputs) + [Desc("tangent", k) for k in plan.diff_outputs],
        outputs=list(io.outputs) + [Desc("grad", i) for i in plan.grad_inputs],
    )
    program.drop_graph("main")
    program.set_graph("joint", gm, io)
    program.record_stat("tangents", len(plan.diff_outputs))
    if bodies_split:
        program.record_stat("bodies_split", bodies_split)
    if attention_changed:
        program.record_stat("attention_statistics_kept", attention_changed)
    return True


@hookimpl
def passkit_register_passes() -> list:
    return [joint]
