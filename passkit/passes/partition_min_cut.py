"""Own ``partition.min_cut``: passkit's own min-cut partitioner, with its options and report.

The joint graph is split where a minimum cut says (see :mod:`passkit.passes.partition_plan`):
each value the backward needs is either saved or recomputed, whichever the rules and the memory
limit allow at the least estimated time. The rules, strongest first:

1. inputs and random ops (``nondeterministic_seeded``, except attention whose ``dropout_p`` is 0)
   are never recomputed;
2. ``never_recompute`` ops are never recomputed; ``save`` ops are also always saved when
   anything the backward needs is computed from them (selective checkpointing's MUST_SAVE);
3. ``recompute`` ops, and every op inside a module that ``recompute_modules`` names, are always
   recomputed; so are ops under ``torch.utils.checkpoint`` (its ``recompute`` tags; a
   ``MUST_SAVE``/``PREFER_SAVE`` tag counts as ``save``);
4. everything else is recomputed only where that buys memory the limit asks for, choosing the
   plan with the least estimated recompute time (``estimator``), unless a plan that saves fewer
   bytes costs at most ``time_slack`` of the estimated step time more. With no limit
   (``memory_budget = 1``) nothing is recomputed that costs time: only views and other free ops.

The step's report row shows the saved tensors and their bytes (each storage once), the
estimated recompute time, and which ops were recomputed by which rule.
"""

from __future__ import annotations

import fnmatch
import operator
import re
from collections import Counter
from typing import Any, Callable, Literal

import pydantic
import torch
from torch.fx import GraphModule, Node
from torch.utils.checkpoint import CheckpointPolicy

from passkit import _torch
from passkit.errors import PassError
from passkit.core.hookspecs import hookimpl
from passkit.passes.partition import BudgetOptions, _install, partitioner, split_joint
from passkit.passes.partition_costs import estimator_for, node_bytes, storage_root
from passkit.passes.partition_plan import Plan, PlanError, Problem
from passkit.core.program import Desc, GraphIO, Program

__all__ = ["body_partition", "min_cut", "MinCutOptions", "parse_size", "format_size", "SMALLEST_STAT"]

SMALLEST_STAT = "smallest_bytes"  # recorded under max_saved: the fewest bytes this graph can save

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")
_OP_RE = re.compile(r"^[a-z_][a-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")
_SAVE_TAGS = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)
_RECOMPUTE_TAGS = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)


def parse_size(value: str | int) -> int:
    """``"2GiB"`` -> 2147483648; plain numbers are bytes. KB/MB/GB are powers of 1000."""
    if isinstance(value, bool):
        raise ValueError("must be a size such as '2GiB' or a number of bytes")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    match = _SIZE_RE.match(value)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"must be a size such as '2GiB', '512MiB' or a number of bytes, not {value!r}")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _check_op(name: str) -> str:
    if not _OP_RE.match(name):
        raise ValueError(f"{name!r} is not an op name such as 'aten.mm' or 'aten.mm.default'")
    namespace, op, *overload = name.split(".")
    packet = getattr(getattr(torch.ops, namespace), op, None) if hasattr(torch.ops, namespace) else None
    if packet is None or (overload and overload[0] not in packet.overloads()):
        raise ValueError(f"no op named {name!r}")
    return name


class MinCutOptions(BudgetOptions):
    """Options of ``partition.min_cut`` (see docs/partitioning.md)."""

    memory_budget: float = 1.0
    """Saved bytes to allow, from 0 (the fewest the rules allow) to 1 (the fastest plan); with
    ``fused_pointwise`` the scale still ends at the fastest unfused plan's bytes."""
    max_saved: str | int | None = None
    """An absolute limit on saved bytes ("2GiB", "512MiB", or an integer)."""
    estimator: Literal["flops", "profile"] = "flops"
    """How recompute time is estimated: a FLOP and bandwidth model, or timing each op."""
    time_slack: float = pydantic.Field(default=0.01, ge=0.0, le=1.0)
    """Under a limit, prefer a plan that saves fewer bytes when it is at most this fraction of the
    estimated step time slower than the fastest plan that fits (time nobody can measure)."""
    fused_pointwise: bool = False
    """Pointwise ops cost nothing to recompute: the code generator fuses them (codegen.inductor)."""
    save: list[str] = []
    recompute: list[str] = []
    never_recompute: list[str] = []
    recompute_modules: list[str] = []
    """Module paths (globs over ``nn_module_stack``, e.g. "layers.*.mlp") to recompute whole."""

    @pydantic.field_validator("max_saved")
    @classmethod
    def _size(cls, value: str | int | None) -> str | int | None:
        if value is not None:
            parse_size(value)
        return value

    @pydantic.field_validator("save", "recompute", "never_recompute")
    @classmethod
    def _ops(cls, value: list[str]) -> list[str]:
        return [_check_op(name) for name in value]

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> MinCutOptions:
        for other in ("save", "never_recompute"):
            clash = sorted(set(self.recompute) & set(getattr(self, other)))
            if clash:
                raise ValueError(f"{clash[0]!r} is in both recompute and {other}")
        return self


def _op_names(node: Node) -> set[str]:
    name = str(node.target)
    packet = getattr(node.target, "overloadpacket", None)
    return {name} | ({str(packet)} if packet is not None else set())


def _module_paths(node: Node) -> list[str]:
    """Module paths of the node's ``nn_module_stack``, written as ``blocks.0.mlp``."""
    paths = []
    for entry in (node.meta.get("nn_module_stack") or {}).values():
        path = entry[0] if isinstance(entry, tuple) else str(entry)
        path = re.sub(r"^L\['self'\]\.?|^self\.?", "", path)
        path = re.sub(r"\._modules\['([^']+)'\]|\[['\"]?([^'\"\]]+)['\"]?\]", lambda m: "." + (m.group(1) or m.group(2)), path)
        paths.append(path.lstrip("."))
    return paths


class _Rules:
    """Which rule keeps, saves or recomputes each forward node."""

    def __init__(self, options: MinCutOptions, forward: set[Node]) -> None:
        self.keep: dict[Node, str] = {}
        self.save: set[Node] = set()
        self.recompute: dict[Node, str] = {}
        save_ops, never_ops, recompute_ops = set(options.save), set(options.never_recompute), set(options.recompute)
        for node in forward:
            if node.op != "call_function":
                continue
            source = node.args[0] if node.target is operator.getitem else node
            names = _op_names(source) if isinstance(source, Node) else _op_names(node)
            tag = node.meta.get("recompute")
            if _torch.call_draws_random_numbers(node):
                self.keep[node] = "random"
            elif names & never_ops:
                self.keep[node] = "never_recompute"
            elif names & save_ops or (tag in _SAVE_TAGS and not names & recompute_ops):
                self.keep[node] = "save"
                self.save.add(node)
            elif names & recompute_ops:
                self.recompute[node] = "recompute"
            elif options.recompute_modules and any(
                fnmatch.fnmatchcase(path, pattern) for path in _module_paths(node) for pattern in options.recompute_modules
            ):
                self.recompute[node] = "recompute_modules"
            elif tag in _RECOMPUTE_TAGS:
                self.recompute[node] = "checkpoint"

    def reason(self, node: Node, limited_by: str, free: bool) -> str:
        if node in self.recompute:
            return self.recompute[node]
        return "free" if free else limited_by


def _classify(joint_gm: GraphModule, io: GraphIO) -> tuple[set[Node], set[Node], set[Node]]:
    """Forward values, those the forward outputs need, and those the backward reads."""
    placeholders = [n for n in joint_gm.graph.nodes if n.op == "placeholder"]
    tangents = [p for p, d in zip(placeholders, io.inputs) if d.kind == "tangent"]
    output = next(n for n in reversed(joint_gm.graph.nodes) if n.op == "output")
    n_fwd = sum(1 for d in io.outputs if d.kind in ("mutation", "user"))
    backward: set[Node] = set(tangents)
    for node in joint_gm.graph.nodes:
        if node.op != "output" and any(a in backward for a in node.all_input_nodes):
            backward.add(node)
    # A subgraph's get_attr is no value to save: each graph reads the module itself (split_joint).
    forward = {n for n in joint_gm.graph.nodes if n.op not in ("output", "get_attr") and n not in backward}
    required: set[Node] = set()
    stack = [a for a in output.args[0][:n_fwd] if isinstance(a, Node)]
    while stack:
        node = stack.pop()
        if node not in required:
            required.add(node)
            stack.extend(node.all_input_nodes)
    grads = list(output.args[0][n_fwd:])
    read = {a for b in backward for a in b.all_input_nodes if a in forward}
    read |= {g for g in grads if isinstance(g, Node) and g in forward}
    return forward, required, read


def _limit(options: MinCutOptions, smallest: Plan, top: int) -> tuple[int | None, str]:
    limits = []
    if options.memory_budget < 1.0:
        span = max(top - smallest.bytes, 0)
        limits.append((smallest.bytes + int(options.memory_budget * span), "memory_budget"))
    if options.max_saved is not None:
        limits.append((parse_size(options.max_saved), "max_saved"))
    if not limits:
        return None, "memory_budget"
    return min(limits)


@partitioner("partition.min_cut", options=MinCutOptions)
def min_cut(program: Program, **values: Any) -> bool:
    """Split joint with passkit's min-cut: memory limits, measured costs, checkpoint rules in the file."""
    options = MinCutOptions(**values)
    joint_gm = program.graphs["joint"]
    io = program.io("joint")
    plan, smallest, rules, problem, limited_by = _plan(joint_gm, io, options)
    _install(program, *split_joint(joint_gm, io, list(plan.saved)))
    _report(program, plan, rules, problem, limited_by)
    if options.max_saved is not None:  # what the model-wide ledger may shrink this graph to
        program.record_stat(SMALLEST_STAT, smallest.bytes)
    return True


def _plan(joint_gm: GraphModule, io: GraphIO, options: MinCutOptions) -> tuple[Plan, Plan, _Rules, Problem, str]:
    """The plan ``options`` ask for, the smallest plan, the rules, the problem and what limited it."""
    forward, required, read = _classify(joint_gm, io)
    rules = _Rules(options, forward)
    estimate = estimator_for(options.estimator, fused_pointwise=options.fused_pointwise)

    def costed(estimator: Any) -> Problem:
        problem = Problem(
            forward=forward, required=required, read_by_backward=read, time_ns={},
            keep=set(rules.keep), must_recompute=set(rules.recompute), must_save=rules.save,
        )
        problem.time_ns.update(
            {n: int(round(estimator(n) * 1e9)) for n in problem.relevant if n in required and n.op == "call_function"}
        )
        return problem

    problem = costed(estimate)
    try:
        fastest = problem.fastest()
        # The smallest plan sets the scale of a limit; without one it is not needed (a second
        # min-cut over the whole graph).
        limited = options.memory_budget < 1.0 or options.max_saved is not None
        smallest = problem.smallest() if limited else fastest
        top = fastest.bytes
        if options.fused_pointwise and options.memory_budget < 1.0:
            # A budget's scale ends at the fastest plan of unfused code, whatever the code
            # generator: the same budget is the same bytes in `training` and `training-python`
            # (and close to torch's own scale); fusion only makes plans under it faster.
            unfused = costed(estimator_for(options.estimator, fused_pointwise=False)).fastest()
            top = max(top, unfused.bytes)
        limit, limited_by = _limit(options, smallest, top)
        slack_ns = 0 if limit is None else int(options.time_slack * _step_time_ns(joint_gm, estimate))
        plan = fastest if limit is None else problem.fastest_within(limit, slack_ns=slack_ns)
    except PlanError as exc:
        raise PassError(f"partition.min_cut: {exc}") from None
    if plan is None:
        error = PassError(
            f"partition.min_cut: max_saved = {options.max_saved!r} cannot be met; the smallest limit this "
            f"program can meet is {format_size(smallest.bytes)} ({smallest.bytes} bytes)"
        )
        error.smallest_saved = smallest.bytes  # what the model-wide ledger (passkit.frontends.saved_limit) reads
        raise error
    return plan, smallest, rules, problem, limited_by


def body_partition(options: MinCutOptions) -> Callable[..., tuple[GraphModule, GraphModule]]:
    """A partition function in torch's convention for the bodies of ``invoke_subgraph`` calls
    (``_torch.partition_region_bodies``): passkit's min-cut with ``options`` on one body's joint.

    torch hands it the body's joint with ``primals_*`` and ``tangents_*`` placeholders and the
    outputs ``(*forward outputs, *gradients)``; it returns the forward, whose outputs are the
    forward outputs and then the saved values, and the backward, which reads the saved values
    and then the tangents: the same cut ``split_joint`` makes of a whole program.
    """

    def partition(joint_gm: GraphModule, _inputs: Any, *, num_fwd_outputs: int, **_: Any) -> tuple[GraphModule, GraphModule]:
        placeholders = [n for n in joint_gm.graph.nodes if n.op == "placeholder"]
        tangents = [n for n in placeholders if n.name.startswith("tangents")]
        outputs = next(n for n in reversed(joint_gm.graph.nodes) if n.op == "output").args[0]
        io = GraphIO(
            inputs=[Desc("user", i) for i in range(len(placeholders) - len(tangents))]
            + [Desc("tangent", k) for k in range(len(tangents))],
            outputs=[Desc("user", i) for i in range(num_fwd_outputs)]
            + [Desc("grad", i) for i in range(len(outputs) - num_fwd_outputs)],
        )
        plan = _plan(joint_gm, io, options)[0]
        forward, _, backward, _ = split_joint(joint_gm, io, list(plan.saved))
        return forward, backward

    return partition


def _step_time_ns(joint_gm: GraphModule, estimate: Any) -> float:
    """The estimated time of the whole joint graph: forward and backward once each."""
    return sum(estimate(n) for n in joint_gm.graph.nodes if n.op == "call_function") * 1e9


def _report(program: Program, plan: Plan, rules: _Rules, problem: Problem, limited_by: str) -> None:
    inputs = {storage_root(n) for n in plan.saved if storage_root(n).op == "placeholder"}
    program.record_stat("saved", len(plan.saved))
    program.record_stat("saved_bytes", plan.bytes)
    program.record_stat("activation_bytes", plan.bytes - sum(node_bytes(r) for r in inputs))
    program.record_stat("recompute_ms", round(plan.time_ns / 1e6, 3))
    by_rule: dict[str, Counter[str]] = {}
    for node in sorted(plan.recomputed, key=lambda n: n.name):
        if node.op != "call_function":
            continue
        free = problem.time_ns.get(node, 0) == 0 and node not in rules.recompute
        by_rule.setdefault(rules.reason(node, limited_by, free), Counter())[str(node.target)] += 1
    program.record_stat("recomputed", {rule: dict(sorted(ops.items())) for rule, ops in sorted(by_rule.items())})


@hookimpl
def passkit_register_passes() -> list:
    return [min_cut]
