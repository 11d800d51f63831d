"""Own ``passkit.to_executorch``: an ``ExportedProgram`` run through an ``edge`` pipeline and
written as an ExecuTorch ``.pte``.

The program (from ``passkit.export`` or ``torch.export``) becomes a ``Program`` as in
``passkit.export`` (``program_from_exported``), and the pipeline's steps run over it with the
same runner (reports, ``verify``, dumps, reproducers, the compile cache). Its ``edge.lower`` and
``edge.delegate`` steps (``passkit.passes.edge``) call back here through ``program.notes``:
``EdgeBridge`` rebuilds the ``ExportedProgram`` from the program's descriptors, hands it to
ExecuTorch (``passkit._torch.executorch``, the one module that imports it), and puts what comes
back into the program, each placeholder still naming the input it came in as, so ``verify =
"numerics"`` compares every step with the captured program on the same inputs.

The ``.pte`` records the pipeline, its fingerprint and passkit's version as constant methods
(``pte_record`` reads them back).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch.export.graph_signature import InputKind

from passkit import _torch
from passkit.artifacts.snapshot import copy_graph_module
from passkit.core.program import Desc, GraphIO, Program
from passkit.core.report import Report
from passkit.errors import PasskitError
from passkit.frontends.compiling import Progress, load_pipeline, run_steps
from passkit.frontends.export import EXPORT_NOTE, program_from_exported
from passkit.frontends.export_signature import ExportState, exported_from_program
from passkit.frontends.package import export_record
from passkit.passes.edge import EDGE_NOTE

__all__ = ["DEFAULT_EDGE_PIPELINE", "RECORD_METHODS", "EdgeBridge", "Lowered", "lower_to_executorch", "pte_record",
           "resolve_edge_pipeline", "to_executorch", "with_partitioners"]

DEFAULT_EDGE_PIPELINE = "edge"
RECORD_METHODS = ("passkit_pipeline", "passkit_fingerprint", "passkit_version", "passkit_export_pipeline")


def resolve_edge_pipeline(pipeline: Any, settings: dict[str, Any]) -> Any:
    """The pipeline ``passkit.to_executorch`` runs: loaded, refused in one line unless it is an
    edge pipeline (``kind = "edge"``)."""
    resolved = load_pipeline(pipeline)
    if resolved.kind != "edge":
        raise PasskitError(
            f'{resolved.label}: passkit.to_executorch runs a pipeline with kind = "edge" (it lowers to ExecuTorch), '
            f"such as 'edge', or one that extends it; this one is kind = {resolved.kind!r}"
        )
    return resolved.with_settings(**settings) if settings else resolved


class EdgeBridge:
    """What ``edge.lower`` and ``edge.delegate`` call: the program handed to ExecuTorch and back."""

    def lower(self, program: Program) -> None:
        self._adopt(program, _torch.edge_lower(self.exported(program)))

    def delegate(self, program: Program, partitioners: tuple[str, ...]) -> bool:
        if not partitioners:
            return False
        self._adopt(program, _torch.edge_delegate(self.exported(program), partitioners))
        return True

    def exported(self, program: Program) -> torch.export.ExportedProgram:
        """The program as an ``ExportedProgram`` (ExecuTorch's verifier once it is Edge), without
        the parameters and buffers nothing reads any more (delegated ones: the backend holds them)."""
        gm, io = copy_graph_module(program.graphs["main"]), program.io("main")
        kept = []
        for node, desc in zip([n for n in gm.graph.nodes if n.op == "placeholder"], io.inputs):
            if desc.kind != "user" and not node.users:
                gm.graph.erase_node(node)
            else:
                kept.append(desc)
        gm.recompile()
        signature = dataclasses.replace(program.signature, graph_io={"main": GraphIO(inputs=kept, outputs=list(io.outputs))})
        trimmed = dataclasses.replace(program, graphs={"main": gm}, signature=signature)
        verifiers = _torch.edge_verifiers() if _torch.edge_ops_in(gm) else None
        return exported_from_program(trimmed, program.notes[EXPORT_NOTE], verifiers=verifiers)

    def _adopt(self, program: Program, ep: torch.export.ExportedProgram) -> None:
        """Install ``ep``'s graph as ``main`` with one placeholder per captured input, in order
        (a parameter found by its state-dict name, a user input by its position; one ExecuTorch
        no longer reads, delegated or shared with another, comes back unread), as every stage of
        a program takes them; what ExecuTorch added to the state dict and constants is kept for
        the next rebuild."""
        state: ExportState = program.notes[EXPORT_NOTE]
        by_target = {spec.target: i for i, spec in enumerate(state.inputs) if spec.kind != InputKind.USER_INPUT}
        users = [i for i, spec in enumerate(state.inputs) if spec.kind == InputKind.USER_INPUT]
        gm = ep.graph_module
        placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
        found: dict[int, torch.fx.Node] = {}
        next_user = 0
        for node, spec in zip(placeholders, ep.graph_signature.input_specs):
            if spec.kind == InputKind.USER_INPUT:
                index, next_user = users[next_user], next_user + 1
            elif spec.target in by_target:
                index = by_target[spec.target]
            else:  # a constant lifted since capture: state of main's own, lifted again at the next rebuild
                _read_as_attribute(gm, node, {**ep.state_dict, **ep.constants}[spec.target])
                continue
            found[index] = node
        first = next(node for node in gm.graph.nodes if node.op != "placeholder")
        for index, info in enumerate(program.signature.inputs):
            node = found.get(index)
            if node is None:
                with gm.graph.inserting_before(first):
                    node = gm.graph.placeholder(f"unread_{info.name}")
                node.meta["val"] = program.example_inputs[index]
            else:
                first.prepend(node)
        descs = [Desc(info.kind, index) for index, info in enumerate(program.signature.inputs)]
        gm.recompile()
        state.state_dict.update(ep.state_dict)
        state.constants.update(ep.constants)
        outputs = program.io("main").outputs
        gm.meta.update(program.graphs["main"].meta)
        program.set_graph("main", gm, GraphIO(inputs=descs, outputs=list(outputs)))


def _read_as_attribute(gm: torch.fx.GraphModule, placeholder: torch.fx.Node, value: Any) -> None:
    """Replace ``placeholder`` with a ``get_attr`` of ``value`` registered on ``gm``."""
    name = f"_passkit_{placeholder.name}"
    setattr(gm, name, value)
    # A plain tensor attribute, as export_signature lifts one into a CONSTANT_TENSOR input; FX
    # warns that it is neither a parameter nor a buffer, which is the point.
    with gm.graph.inserting_before(next(node for node in gm.graph.nodes if node.op != "placeholder")), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        read = gm.graph.get_attr(name)
    read.meta.update(placeholder.meta)
    placeholder.replace_all_uses_with(read)
    gm.graph.erase_node(placeholder)


@dataclass
class Lowered:
    """What ``lower_to_executorch`` made: the ``.pte``'s bytes, the run's report, the record."""

    pte: bytes
    report: Report
    record: dict[str, str]


def lower_to_executorch(
    exported: torch.export.ExportedProgram, *, pipeline: Any = DEFAULT_EDGE_PIPELINE,
    partitioners: Sequence[str] | None = None, progress: Progress | None = None, **settings: Any,
) -> Lowered:
    """Run an edge pipeline over ``exported`` and make its ``.pte`` (see ``to_executorch``)."""
    missing = _torch.executorch_missing()
    if missing:
        raise PasskitError(f"passkit.to_executorch: {missing}")
    if not isinstance(exported, torch.export.ExportedProgram):
        raise PasskitError(f"passkit.to_executorch: expected an ExportedProgram, got {type(exported).__name__}")
    resolved = resolve_edge_pipeline(pipeline, settings)
    if partitioners is not None:
        resolved = with_partitioners(resolved, partitioners)
    program, real_inputs = program_from_exported(exported)
    made_by = export_record(exported)
    # A program passkit.export made holds the facts its steps left (checked again under verify).
    program.facts |= {fact for fact in made_by.get("facts", ()) if fact in ("functional",)}
    program.notes[EDGE_NOTE] = bridge = EdgeBridge()
    with torch.no_grad():
        report = run_steps(program, real_inputs, resolved, progress=progress)
    from passkit import __version__

    record = {"passkit_pipeline": resolved.name, "passkit_fingerprint": resolved.fingerprint(), "passkit_version": __version__}
    if made_by:
        record["passkit_export_pipeline"] = str(made_by["pipeline"])
    return Lowered(_torch.pte_bytes(bridge.exported(program), record), report, record)


def with_partitioners(pipeline: Any, partitioners: Sequence[str]) -> Any:
    """``pipeline`` with every ``edge.delegate`` step delegating to ``partitioners`` (its
    fingerprint, so the compile cache key, changes with them)."""
    unknown = [name for name in partitioners if name not in _torch.EDGE_PARTITIONERS]
    if unknown:
        raise PasskitError(f"passkit.to_executorch: unknown partitioner {unknown[0]!r}; "
                           f"passkit knows {', '.join(_torch.EDGE_PARTITIONERS)}")
    steps = tuple(
        dataclasses.replace(step, options=step.options.model_copy(update={"partitioners": list(partitioners)}),
                            origin={**step.origin, "partitioners": "<argument>"})
        if step.pass_name == "edge.delegate" else step
        for step in pipeline.steps
    )
    return dataclasses.replace(pipeline, steps=steps)


def to_executorch(
    exported: torch.export.ExportedProgram, path: str | Path, *, pipeline: Any = DEFAULT_EDGE_PIPELINE,
    partitioners: Sequence[str] | None = None, progress: Progress | None = None, **settings: Any,
) -> str:
    """Lower ``exported`` (from ``passkit.export`` or ``torch.export``) to ExecuTorch through
    ``pipeline`` (``kind = "edge"``) and write the ``.pte`` at ``path``; returns the path.
    ``partitioners`` replaces the backends its ``edge.delegate`` steps hand parts to
    (``("xnnpack",)`` in ``edge``; ``()`` for none: the runtime's portable kernels run every op). ``settings`` are pipeline settings (``verify``, ``dump``, ``report``, ``cache``, ...);
    the run's report is ``passkit.reports()[-1]``.

    Raises:
        PasskitError: ExecuTorch is not installed, or the pipeline is not an edge pipeline.
        PassError: a step failed.
    """
    lowered = lower_to_executorch(exported, pipeline=pipeline, partitioners=partitioners, progress=progress, **settings)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(lowered.pte)
    return str(target)


def pte_record(path: str | Path) -> dict[str, str]:
    """What passkit recorded in a ``.pte`` it wrote: pipeline, fingerprint, version ({} for another)."""
    return _torch.pte_record(Path(path).read_bytes(), RECORD_METHODS)
