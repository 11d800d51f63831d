"""Own the partitioners: split ``joint`` into ``forward`` and ``backward`` graphs.

``partition.default`` computes in the forward exactly what the forward outputs need and saves
every forward value the backward reads; backward-only work that depends on primals alone (a
weight's transpose, say) moves to the backward. ``partition.torch_min_cut`` hands the joint
graph to torch's own min-cut rematerialization partitioner (which honours the ``recompute``
tags that ``torch.utils.checkpoint`` leaves), so the two can be compared in one run; random ops
are tagged to be saved first, as torch's partitioner would recompute most of them.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import pydantic
import torch
from torch.fx import Graph, GraphModule, Node
from torch.utils.checkpoint import CheckpointPolicy

from passkit import _torch
from passkit.errors import PassError
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import Pass, graph_pass
from passkit.core.program import Desc, GraphIO, Program

__all__ = ["BudgetOptions", "default_partition", "partitioner", "torch_min_cut", "split_joint"]


def _output_args(gm: GraphModule) -> list[Any]:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return list(output.args[0])


def _ancestors(roots: list[Any], stop: set[Node] | frozenset[Node] = frozenset()) -> set[Node]:
    """Nodes the roots depend on; the walk does not go past nodes in ``stop``."""
    seen: set[Node] = set()
    stack = [r for r in roots if isinstance(r, Node)]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            if node not in stop:
                stack.extend(node.all_input_nodes)
    return seen


def _build(joint: GraphModule, inputs: list[Node], body: list[Node], outputs: list[Any]) -> GraphModule:
    graph = Graph()
    env: dict[Node, Node] = {}
    for node in inputs:
        new = graph.placeholder(node.name)
        new.meta = dict(node.meta)
        env[node] = new
    for node in body:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[o] if isinstance(o, Node) else o for o in outputs))
    return GraphModule(joint, graph)


def _forward_side_effects(joint: GraphModule, tangents: list[Node]) -> list[Node]:
    """Calls kept only for their effect (``_linalg_check_errors``) that read no tangent."""
    from_tangents: set[Node] = set(tangents)
    for node in joint.graph.nodes:
        if any(n in from_tangents for n in node.all_input_nodes):
            from_tangents.add(node)
    return [
        n for n in joint.graph.nodes
        if n.op == "call_function" and not n.users and _torch.is_impure(n) and n not in from_tangents
    ]


def _recompute_at_first_use(body: list[Node], tangents: set[Node]) -> list[Node]:
    """``body`` (the backward's nodes in joint order) with each recomputed forward value moved to
    just before its first use, the order autograd would run them in.

    In joint order every recomputation comes first, before the first gradient. Recomputed
    values then live through the whole backward, and Inductor, whose scheduler fuses in graph
    order, groups the kernels differently than for the graphs torch's partitioner orders this
    way (one C++ kernel more on the MLP's backward, about half a second more to compile).
    """
    from_tangents = set(tangents)
    for node in body:
        if any(n in from_tangents for n in node.all_input_nodes):
            from_tangents.add(node)
    recomputed = {n for n in body if n not in from_tangents}
    placed: set[Node] = set()
    ordered: list[Node] = []

    def place(node: Node) -> None:
        pending = [(node, False)]
        while pending:
            current, inputs_placed = pending.pop()
            if current in placed:
                continue
            if inputs_placed:
                placed.add(current)
                ordered.append(current)
                continue
            pending.append((current, True))
            pending.extend((n, False) for n in reversed(current.all_input_nodes) if n in recomputed and n not in placed)

    for node in body:
        if node in from_tangents:
            place(node)
    for node in body:  # recomputed values that only an output reads
        place(node)
    return ordered


def split_joint(joint: GraphModule, io: GraphIO, saved: list[Node]) -> tuple[GraphModule, GraphIO, GraphModule, GraphIO]:
    """Cut ``joint`` given the values to save; returns forward and backward with descriptors.

    A ``get_attr`` (a higher-order op's subgraph, a constant) is never saved: each graph that
    reads it gets its own ``get_attr`` of the same module attribute.
    """
    saved = [n for n in saved if n.op != "get_attr"]
    placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
    outputs = _output_args(joint)
    n_fwd = io.n_visible
    primals = [p for p, d in zip(placeholders, io.inputs) if d.kind != "tangent"]
    tangents = [p for p, d in zip(placeholders, io.inputs) if d.kind == "tangent"]
    saved = saved + _symbol_inputs(saved + tangents, primals)
    forward_nodes = _ancestors(outputs[:n_fwd] + saved)
    # Side-effect-only calls on forward values (linalg's error checks) run in the forward.
    forward_nodes |= _ancestors(_forward_side_effects(joint, tangents))
    saved_set = set(saved)
    backward_nodes = _ancestors(outputs[n_fwd:], stop=saved_set)
    missing = [n.name for n in backward_nodes if n.op == "placeholder" and n not in saved_set and n not in tangents]
    if missing:
        raise RuntimeError(f"backward reads primals that are not saved: {', '.join(missing)}")
    order = [n for n in joint.graph.nodes if n.op not in ("placeholder", "output")]
    fw_body = [n for n in order if n in forward_nodes]
    bw_body = _recompute_at_first_use(
        [n for n in order if n in backward_nodes and n not in saved_set and n.op != "placeholder"], set(tangents))
    forward = _build(joint, primals, fw_body, outputs[:n_fwd] + saved)
    backward = _build(joint, saved + tangents, bw_body, outputs[n_fwd:])
    fw_io = GraphIO(
        inputs=[d for d in io.inputs if d.kind != "tangent"],
        outputs=list(io.outputs[:n_fwd]) + [Desc("saved", k) for k in range(len(saved))],
    )
    bw_io = GraphIO(
        inputs=[Desc("saved", k) for k in range(len(saved))] + [d for d in io.inputs if d.kind == "tangent"],
        outputs=list(io.outputs[n_fwd:]),
    )
    return forward, fw_io, backward, bw_io


def _symbol_inputs(inputs: list[Node], primals: list[Node]) -> list[Node]:
    """Primals to save as well, so that the backward binds every size symbol its inputs read.

    A saved view flattened to ``s75*s95`` binds neither symbol; without ``s95`` as an input of
    its own, Inductor cannot compile the backward (torch's partitioner saves such symbols too).
    """
    values = [n.meta.get("val") for n in inputs]
    missing = set().union(*map(_torch.symbols_needed, values)) - set().union(*map(_torch.symbols_bound, values))
    added: list[Node] = []
    # A SymInt primal first: saving a whole tensor for one of its sizes would keep it alive.
    by_preference = sorted(primals, key=lambda n: not isinstance(n.meta.get("val"), torch.SymInt))
    for primal in by_preference:
        if not missing:
            break
        bound = _torch.symbols_bound(primal.meta.get("val")) & missing
        if bound and primal not in inputs:
            added.append(primal)
            missing -= bound
    return added


def _saved_by_default(joint: GraphModule, io: GraphIO) -> list[Node]:
    outputs = _output_args(joint)
    n_fwd = io.n_visible
    forward = _ancestors(outputs[:n_fwd])
    tangent_nodes = {
        p for p, d in zip((n for n in joint.graph.nodes if n.op == "placeholder"), io.inputs) if d.kind == "tangent"
    }
    needed_by_backward = _ancestors(outputs[n_fwd:])
    saved = []
    for node in joint.graph.nodes:
        if node.op == "output" or node in tangent_nodes:
            continue
        if node not in forward and node.op != "placeholder":
            continue
        if any(user in needed_by_backward and user not in forward for user in node.users):
            saved.append(node)
    return _no_tuple_saves(saved)


def _no_tuple_saves(saved: list[Node]) -> list[Node]:
    """Save the tensors a multi-output op produced, never the op's tuple itself."""
    result: list[Node] = []
    for node in saved:
        if isinstance(node.meta.get("val"), (tuple, list)):
            result.extend(u for u in node.users if u.target is operator.getitem and u not in result)
        elif node not in result:
            result.append(node)
    return result


def _install(program: Program, forward: GraphModule, fw_io: GraphIO, backward: GraphModule, bw_io: GraphIO) -> None:
    for gm in (forward, backward):
        gm.graph.eliminate_dead_code(is_impure_node=_torch.is_impure)
        gm.recompile()
    program.drop_graph("joint")
    program.set_graph("forward", forward, fw_io)
    program.set_graph("backward", backward, bw_io)
    n_saved = sum(1 for d in bw_io.inputs if d.kind == "saved")
    saved = [n for n in backward.graph.nodes if n.op == "placeholder"][:n_saved]
    sizes = {n.name: _nbytes(n.meta.get("val")) for n in saved if isinstance(n.meta.get("val"), torch.Tensor)}
    program.record_stat("saved", len(sizes))
    program.record_stat("saved_bytes", sum(sizes.values()))
    # Inputs are alive anyway; what partitioning decides is how many activations stay alive.
    program.record_stat("activation_bytes", sum(b for name, b in sizes.items() if not name.startswith("primals_")))


def _nbytes(value: torch.Tensor) -> int:
    return value.numel() * value.element_size()


def partitioner(name: str, *, options: type[pydantic.BaseModel] | None = None) -> Callable[[Callable[..., Any]], Pass]:
    """Declare a partitioner: it turns the joint graph into forward and backward, for training."""
    return graph_pass(
        name, requires={"joint"}, produces={"partitioned"}, invalidates={"joint"}, training_only=True, options=options
    )


@partitioner("partition.default")
def default_partition(program: Program) -> bool:
    """Split joint into forward and backward, saving every forward value the backward reads."""
    joint_gm = program.graphs["joint"]
    io = program.io("joint")
    saved = _saved_by_default(joint_gm, io)
    _install(program, *split_joint(joint_gm, io, saved))
    return True


class BudgetOptions(pydantic.BaseModel):
    """A partitioner's ``memory_budget``, validated to lie between 0 and 1."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    memory_budget: float = 1.0
    """Activation memory to keep, from 0 (save only inputs) to 1 (runtime-optimal)."""

    @pydantic.field_validator("memory_budget")
    @classmethod
    def _fraction(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError("must be between 0 and 1")
        return value


@partitioner("partition.torch_min_cut", options=BudgetOptions)
def torch_min_cut(program: Program, *, memory_budget: float) -> bool:
    """Split joint with torch's min-cut rematerialization partitioner (honours recompute tags)."""
    joint_gm = program.graphs["joint"]
    io = program.io("joint")
    n_fwd = io.n_visible
    _save_random_values(joint_gm)
    forward, backward = _torch.min_cut_partition(joint_gm, n_fwd, memory_budget=memory_budget)
    redrawn = next((n for n in backward.graph.nodes if n.op == "call_function" and _torch.call_draws_random_numbers(n)), None)
    if redrawn is not None:
        raise PassError(
            f"partition.torch_min_cut: torch's plan at memory_budget = {memory_budget} recomputes random op "
            f"{redrawn.target} in the backward, which would draw other numbers than the forward did; "
            "use partition.min_cut, or a budget above 0"
        )
    fw_outputs = _output_args(forward)
    saved_names = [getattr(n, "name", None) for n in fw_outputs[n_fwd:]]
    bw_inputs = [n for n in backward.graph.nodes if n.op == "placeholder"]
    tangent_descs = [d for d in io.inputs if d.kind == "tangent"]
    bw_descs = []
    for node in bw_inputs:
        if node.name.startswith("tangents_"):
            bw_descs.append(tangent_descs[int(node.name.split("_")[1]) - 1])
        else:
            bw_descs.append(Desc("saved", saved_names.index(node.name)))
    fw_io = GraphIO(
        inputs=[d for d in io.inputs if d.kind != "tangent"],
        outputs=list(io.outputs[:n_fwd]) + [Desc("saved", k) for k in range(len(saved_names))],
    )
    bw_io = GraphIO(inputs=bw_descs, outputs=list(io.outputs[n_fwd:]))
    _install(program, forward, fw_io, backward, bw_io)
    return True


def _save_random_values(joint: GraphModule) -> None:
    """Tag every random op's values ``MUST_SAVE``, so the backward never draws them again.

    torch's partitioner knows three random ops (``native_dropout``, ``rand_like``,
    ``randn_like``); below budget 1 it recomputes the others, such as the ``bernoulli`` that CPU
    dropout draws, and a recomputed mask differs from the forward's: wrong gradients, silently.
    """
    for node in joint.graph.nodes:
        if node.op == "call_function" and _torch.call_draws_random_numbers(node):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE


@hookimpl
def passkit_register_passes() -> list:
    return [default_partition, torch_min_cut]
