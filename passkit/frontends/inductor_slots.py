"""Own mounting a pipeline file in stock Inductor: ``passkit.inductor_options(file)``.

``torch.compile(model, options=passkit.inductor_options("my-passes.toml"))`` keeps torch's whole
stack (Dynamo, AOT Autograd, Inductor, its FX graph cache, CUDA graphs, max-autotune) and runs
the file's steps in Inductor's custom-pass slots. Each step names its slot (``slot = "..."``;
``passkit.pipeline.slots`` owns the names, what each graph holds and the load-time refusals).
The returned dict holds one entry per slot that has steps, and nothing else, so an empty file
changes nothing.

Each time Inductor calls a slot, its steps run through the ordinary step loop
(``passkit.core.runner``) on a ``Program`` made of the graph it hands over, with the slot's facts:
report rows (``passkit.reports()``), ``verify = "facts"``, dumps, should-run/should-apply
plugins and bisection work as in any pipeline. When Inductor's FX graph cache or AOT Autograd's
cache answers a compile, a slot's steps do not run: each such slot gets one INFO line and a
report of skipped steps marked ``cache = "inductor"`` in ``passkit.reports()``, so the reports
never go silently empty. A slot's ``uuid()`` (its key in Inductor's FX
graph cache) hashes what passkit's own compile cache keys on: the steps' fingerprints and
options (``Pipeline.fingerprint``), their cache contexts, the registered plugins and their
versions, the sources of the pattern sets the steps name, and passkit's own source digest.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any, Sequence

from passkit import _torch
from passkit.frontends.compile_options import record_report
from passkit.errors import PassError
from passkit.core.facts import Fact
from passkit.core.program import Desc, GraphIO, InputInfo, OutputInfo, Program, Signature, TargetOpset
from passkit.core.report import Report, StepRecord

if TYPE_CHECKING:
    import torch

    from passkit.pipeline import Pipeline, Step

__all__ = ["inductor_options", "MountedFile", "mount"]

log = logging.getLogger("passkit")


def inductor_options(pipeline: Any, **settings: Any) -> dict[str, Any]:
    """Inductor config entries that run ``pipeline``'s steps in Inductor's custom-pass slots.

    ``pipeline`` is a registered name, a ``.toml`` path, a dict with a file's keys or a
    ``Pipeline``; ``settings`` override its ``[settings]`` (``verify``, ``dump``...). Pass the
    result as ``torch.compile(..., options=...)`` or to ``torch._inductor.config.patch(...)``.

    Raises:
        PipelineError: one line, naming the step whose pass cannot run in its slot.
    """
    return mount(pipeline, **settings).options()


def mount(pipeline: Any, **settings: Any) -> MountedFile:
    """The mounted file itself: its slot objects (``options()``) and the reports of its runs."""
    from passkit.pipeline import load_pipeline
    from passkit.core.plugins import get_plugin_manager
    from passkit.core.registry import get_registry

    registry = get_registry()
    loaded = load_pipeline(pipeline, registry=registry, mounted=True)
    return MountedFile(loaded.with_settings(**settings), get_plugin_manager(), registry)


class MountedFile:
    """A pipeline checked for the slots, with one slot object per slot that has steps."""

    def __init__(self, pipeline: Pipeline, pm: Any, registry: Any) -> None:
        from passkit.pipeline.slots import SLOTS, slot_steps

        self.pipeline = pipeline
        self.pm = pm
        self.registry = _slot_registry(registry)
        self.reports: list[Report] = []
        self.slots: dict[str, Any] = {}
        self._steps = slot_steps(pipeline)
        # This compile's slots: keyed (their uuid entered a cache key), and run.
        self._keyed: dict[str, str] = {}
        self._ran: set[str] = set()
        self._hits_before = 0
        for name, steps in self._steps.items():
            uuid = slot_uuid(pipeline, name, steps, pm)
            keyed = functools.partial(self._slot_keyed, name)
            if name == "partition":
                self.slots[SLOTS[name].config_key] = _torch.MountedPartitioner(self._partitioner(steps), uuid, keyed)
            else:
                self.slots[SLOTS[name].config_key] = _torch.MountedPass(name, self._graph_pass(name, steps), uuid, keyed)

    def options(self) -> dict[str, Any]:
        """The Inductor config entries: one per slot with steps."""
        return dict(self.slots)

    def _graph_pass(self, slot: str, steps: tuple[Step, ...]) -> Any:
        def run(gm: torch.fx.GraphModule, is_inference: bool | None) -> None:
            graph = gm.graph
            name, program = slot_program(slot, gm, is_inference)
            before, ops = _shape(gm), _ops(gm)
            self._run(slot, steps, program, name)
            if program.target_opset is not None:
                program.graphs[name] = _lowered(program.graphs[name], ops, program.target_opset.table)
            after = _shape(program.graphs[name])
            if after != before:
                raise PassError(
                    f"{self.pipeline.label}: slot {slot!r}: the steps changed the {name} graph's inputs or outputs "
                    f"({before[0]} inputs, {before[1]} outputs -> {after[0]}, {after[1]}); Inductor fixes them in this slot"
                )
            _torch.put_back(gm, graph, program.graphs[name])

        return run

    def _partitioner(self, steps: tuple[Step, ...]) -> Any:
        def choose(joint: torch.fx.GraphModule, joint_inputs: Sequence[Any], num_fwd_outputs: int) -> list[str] | None:
            program = joint_program(joint, list(joint_inputs), num_fwd_outputs)
            self._run("partition", steps, program, "joint")
            if "backward" not in program.graphs:
                return None  # the partitioner was skipped (bisection): torch's own min-cut cuts
            n_saved = sum(1 for d in program.io("backward").inputs if d.kind == "saved")
            placeholders = [n for n in program.graphs["backward"].graph.nodes if n.op == "placeholder"]
            saved = {n.name for n in placeholders[:n_saved]}
            # In the joint's order: a partitioner may pick from a set, and Inductor's cache keys
            # on the forward's code, outputs in order included.
            return [n.name for n in joint.graph.nodes if n.name in saved]

        return choose

    def _slot_keyed(self, slot: str) -> None:
        if not self._keyed and not self._ran:
            self._hits_before = _torch.inductor_cache_hits()
        self._keyed[slot] = self._keyed.get(slot) or _torch.current_compile_id() or ""
        _torch.on_dynamo_compile_end(self._compile_ended)

    def _compile_ended(self) -> None:
        """After a compile that keyed the slots: each slot Inductor's or AOT Autograd's cache
        answered (its steps did not run here) gets one line and a report that says so."""
        keyed, ran = self._keyed, self._ran
        self._keyed, self._ran = {}, set()
        if _torch.inductor_cache_hits() <= self._hits_before:
            return  # not a hit: a slot that did not run had no graph to see (a partitioner at inference)
        for slot, compile_id in keyed.items():
            if slot in ran:
                continue
            graph = f"slot {slot}, Inductor cache hit" + (f" (compile {compile_id})" if compile_id else "")
            reason = "Inductor's cache answered the compile: the steps ran in the process that compiled the entry"
            records = [StepRecord(step.position, step.id, step.pass_name, status="skipped", reason=reason)
                       for step in self._steps[slot]]
            report = Report(self.pipeline.label, records, graph=graph, cache="inductor")
            self.reports.append(report)
            record_report(report)
            log.info("passkit: %s: Inductor's cache answered it; the slot's steps did not run in this process "
                     "(their report is the compiling process's)", graph)

    def _run(self, slot: str, steps: tuple[Step, ...], program: Program, graph: str) -> None:
        from passkit.core.runner import run_pipeline

        self._ran.add(slot)

        part = dataclasses.replace(self.pipeline, steps=steps)
        report = run_pipeline(part, program, pm=self.pm, registry=self.registry)
        report.graph = f"slot {slot}, {graph}"
        self.reports.append(report)
        record_report(report)
        for record in report.records:
            log.info("%s: %s: %s", report.graph, record.id, record.remarks() or record.changed_label)


def slot_uuid(pipeline: Pipeline, slot: str, steps: tuple[Step, ...], pm: Any) -> str:
    """What Inductor's cache keys the slot on: the same parts as passkit's compile cache key."""
    from passkit.cache.store import plan_digest

    part = dataclasses.replace(pipeline, steps=steps)
    plugins = [f"{name}={_plugin_version(plugin)}" for name, plugin in pm.list_name_plugin()]
    text = json.dumps({"slot": slot, "plan": plan_digest(part, plugins), "registered": _registered_sources(steps)},
                      sort_keys=True)
    return "passkit-" + hashlib.sha256(text.encode()).hexdigest()


def _plugin_version(plugin: Any) -> str:
    from passkit.core.code_digest import distribution_version

    module = getattr(plugin, "__name__", None) or type(plugin).__module__
    return distribution_version(str(module))


def _registered_sources(steps: tuple[Step, ...]) -> list[str]:
    """Source digests of what the steps' options name from plugins (pattern sets): a pass's own
    fingerprint covers its module, not the pattern set a plugin registered for it."""
    from passkit.core.pass_api import _source_digest

    found = []
    for step in steps:
        for value in dict(step.options).values():
            for item in value if isinstance(value, (list, tuple)) else [value]:
                registered = getattr(item, "registered", None)
                if callable(registered):
                    found.append(f"{step.id}:{item}={_source_digest(registered)}")
    return found


def _slot_registry(registry: Any) -> Any:
    """The registry with ``partitioned`` checked per graph: a post-grad slot sees the forward
    and the backward one at a time, each a side of a partitioned program."""
    facts = dict(registry.facts)
    full = facts.get("partitioned")
    description = full.description if full is not None else "separate forward and backward graphs"

    def check(program: Program) -> str | None:
        sides = [g for g in ("forward", "backward") if g in program.graphs]
        return None if sides else f"neither a forward nor a backward graph (graphs: {', '.join(program.graphs)})"

    facts["partitioned"] = Fact("partitioned", description, check)
    return dataclasses.replace(registry, facts=facts)


def _ops(gm: torch.fx.GraphModule) -> set[Any]:
    return {node.target for node in gm.graph.nodes if node.op == "call_function"}


def _lowered(gm: torch.fx.GraphModule, before: set[Any], table: dict[Any, Any]) -> torch.fx.GraphModule:
    """``gm`` with the ops the steps brought in lowered through Inductor's decompositions:
    Inductor expects decomposed graphs after AOT Autograd and refuses an op it has a
    decomposition for (a rewrite's replacement traced whole, such as a tanh ``gelu``)."""
    new = {op: table[op] for op in _ops(gm) - before if op in table}
    if not new or _torch.nothing_to_decompose(gm, new):
        return gm
    return _torch.retrace(gm, decompositions=new, functional=False)


def _shape(gm: torch.fx.GraphModule) -> tuple[int, int]:
    nodes = list(gm.graph.nodes)
    output = nodes[-1] if nodes and nodes[-1].op == "output" else None
    outputs = output.args[0] if output is not None else ()
    count = len(outputs) if isinstance(outputs, (list, tuple)) else 1
    return sum(1 for n in nodes if n.op == "placeholder"), count


def _outputs(gm: torch.fx.GraphModule) -> list[Any]:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    value = output.args[0]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def slot_program(slot: str, gm: torch.fx.GraphModule, is_inference: bool | None) -> tuple[str, Program]:
    """A ``Program`` of the one graph a slot sees, with the facts ``SLOTS`` gives it."""
    from passkit.pipeline.slots import SLOTS

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tangents = [n for n in placeholders if _torch.is_tangent(n)]
    values = [n.meta.get("val", n.meta.get("example_value")) for n in placeholders]
    if slot == "pre_grad":
        import torch

        training = torch.is_grad_enabled() and any(getattr(v, "requires_grad", False) for v in values)
        name = "main"
    elif slot.startswith("joint"):
        training, name = bool(tangents), ("joint" if tangents else "main")
    else:
        training = not is_inference if is_inference is not None else True
        name = ("backward" if tangents else "forward") if training else "main"
    facts = SLOTS[slot].training if training else (SLOTS[slot].inference or frozenset())
    if name == "joint":
        n_fwd = len(_outputs(gm)) - (len(placeholders) - len(tangents))
        return name, joint_program(gm, values, n_fwd, facts=set(facts))
    n_out = len(_outputs(gm))
    inputs = [Desc("user", i) for i in range(len(placeholders))]
    outputs = [Desc("grad" if name == "backward" else "user", j) for j in range(n_out)]
    program = _program(gm, name, values, inputs, outputs, n_out, training, set(facts))
    if slot == "pre_grad":
        program.target_opset = None
    return name, program


def joint_program(
    joint: torch.fx.GraphModule, values: list[Any], num_fwd_outputs: int, *, facts: set[str] | None = None
) -> Program:
    """A training ``Program`` of AOT Autograd's joint graph: primals then tangents in; the
    forward's outputs then one gradient per primal (None where none) out."""
    from passkit.pipeline.slots import SLOTS

    placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
    inputs, tangent = [], 0
    for node in placeholders:
        if _torch.is_tangent(node):
            inputs.append(Desc("tangent", tangent))
            tangent += 1
        else:
            inputs.append(Desc("user", len(inputs) - tangent))
    n_out = len(_outputs(joint))
    outputs = [Desc("user", j) for j in range(num_fwd_outputs)]
    outputs += [Desc("grad", i) for i in range(n_out - num_fwd_outputs)]
    program = _program(joint, "joint", values, inputs, outputs, num_fwd_outputs, True,
                       facts if facts is not None else set(SLOTS["partition"].training))
    grads = _outputs(joint)[num_fwd_outputs:]
    for info, grad in zip(program.signature.inputs, grads):
        info.requires_grad = grad is not None
    return program


def _program(
    gm: torch.fx.GraphModule, name: str, values: list[Any], inputs: list[Desc], outputs: list[Desc],
    n_user: int, training: bool, facts: set[str],
) -> Program:
    import torch

    signature = Signature(
        inputs=[InputInfo(name=f"arg{i}", kind="user", is_tensor=isinstance(v, torch.Tensor))
                for i, v in enumerate(v for v, d in zip(values, inputs) if d.kind != "tangent")],
        outputs=[OutputInfo() for _ in range(n_user)],
        graph_io={name: GraphIO(inputs=inputs, outputs=outputs)},
    )
    table = _torch.inductor_decompositions()
    return Program(
        graphs={name: gm}, signature=signature, example_inputs=list(values), fake_mode=_torch.fake_mode_of(values),
        facts=facts, training=training, target_opset=TargetOpset(("inductor",), (), (), table=table),
    )
