"""Own reducing a differing program, and handing it to the reproducer machinery.

``reduce_program`` is delta debugging (Zeller's ddmin) over the program's nodes: drop chunks of
nodes, then single nodes, while the program still differs from eager the same way (the same
``Verdict.kind``); a value that read a dropped node reads its first operand instead
(``FuzzProgram.without``). Then static sizes and inference are tried in place of symbolic sizes
and training, and extra outputs are dropped one at a time.

``write_case`` saves the minimal program as ``program.py`` (``factory()``, the ``--model``
contract) and bisects it as ``passkit bisect`` does (``passkit.debug.bisect_model``: capture,
``bisect_program``, ``write_minimal``, ``confirm``), so the first bad step is named as bisect
names it and the confirmed run writes the reproducer ``passkit repro`` replays. A difference
no step shows (every step agrees with the captured program) is in capture or the runtime
wrapper; the case says so.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from passkit.fuzz.compare import Verdict, one_line
from passkit.fuzz.program import FuzzProgram

if TYPE_CHECKING:
    import pluggy

    from passkit.core.registry import Registry
    from passkit.pipeline import Pipeline

__all__ = ["Case", "reduce_program", "write_case"]


def reduce_program(program: FuzzProgram, verdict: Verdict, judge: Callable[[FuzzProgram], Verdict]) -> FuzzProgram:
    """The smallest program ddmin finds that still differs as ``verdict`` says."""

    def still(candidate: FuzzProgram | None) -> bool:
        if candidate is None or candidate == program:
            return False
        found = judge(candidate)
        return found.bad and found.kind == verdict.kind

    current = program
    chunks = 2
    while current.nodes:
        count = len(current.nodes)
        size = max(1, count // chunks)
        groups = [set(range(start, min(count, start + size))) for start in range(0, count, size)]
        for group in groups:
            candidate = current.without(group)
            if still(candidate):
                assert candidate is not None
                current, chunks = candidate, max(chunks - 1, 2)
                break
        else:
            if size == 1:
                break
            chunks = min(count, chunks * 2)
    # Static sizes and no backward replay more widely (a reproducer cannot hold symbolic sizes).
    for change in ({"dynamic": False}, {"mode": "inference"}):
        simpler = dataclasses.replace(current, **change)
        if simpler != current and current.mode != "export" and still(simpler):
            current = simpler
    for output in list(current.outputs):
        if len(current.outputs) > 1:
            candidate = dataclasses.replace(current, outputs=tuple(v for v in current.outputs if v != output)).without(set())
            if still(candidate):
                assert candidate is not None
                current = candidate
    return current


@dataclass
class Case:
    """A reduced difference, written to ``folder``."""

    folder: str
    verdict: Verdict
    program: FuzzProgram
    original_ops: int
    first_bad_step: str = ""  # as bisect names it: ``<file>: steps[i] (<id>)``
    bad_kind: str = ""
    minimal_pipeline: str = ""
    reproducer: str = ""
    note: str = ""

    def lines(self, *, with_source: bool = False) -> list[str]:
        """How the CLI's summary and ``fuzz_pass``'s failure show the case; ``with_source``:
        the minimal program's ``forward`` too."""
        where = f"{self.folder}/program.py" if self.folder else "not written"
        shown = [f"{self.verdict.kind}: {self.verdict.message}",
                 f"  minimal program: {len(self.program.nodes)} op(s) (from {self.original_ops}), {where}"]
        if self.first_bad_step:
            shown.append(f"  first bad step: {self.first_bad_step} ({self.bad_kind}); reproducer: {self.reproducer}")
        elif self.note:
            shown.append(f"  {self.note}")
        if with_source:
            source = self.program.source()
            forward = source[source.index("    def forward"):source.index("\n\n\ndef factory")]
            shown += ["  " + line for line in forward.splitlines()]
        return shown

    def to_json(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "kind": self.verdict.kind,
            "message": self.verdict.message,
            "ops": len(self.program.nodes),
            "original_ops": self.original_ops,
            "mode": self.program.mode,
            "dynamic": self.program.dynamic,
            "first_bad_step": self.first_bad_step,
            "step_failure": self.bad_kind,
            "minimal_pipeline": self.minimal_pipeline,
            "reproducer": self.reproducer,
            "note": self.note,
            "source": self.program.source(),
        }


def write_case(
    folder: Path, program: FuzzProgram, verdict: Verdict, original_ops: int, pipeline: Pipeline, *,
    pm: pluggy.PluginManager, registry: Registry, plugins: Sequence[str] = (),
) -> Case:
    """Save ``program``, bisect the pipeline over it, and write the minimal pipeline and the
    reproducer into ``folder``."""
    from passkit.core.private_folders import private_folder
    from passkit.debug.bisect import bisect_program, confirm, write_minimal
    from passkit.debug.bisect_model import capture_module

    private_folder(folder, "fuzz case folder")
    (folder / "program.py").write_text(program.source(), encoding="utf-8")
    case = Case(str(folder), verdict, program, original_ops)
    quiet = pipeline.with_settings(repro_dir=str(folder / "repro"), report="", dump="off")
    model, inputs = program.build(f"passkit_fuzz_case_{folder.name.replace('-', '_')}")
    try:
        graphs = capture_module(model, inputs, quiet, training=program.mode == "training", dynamic=program.dynamic)
    except Exception as exc:  # noqa: BLE001 - capture is what fails: nothing to bisect
        case.note = f"capturing it for bisect failed: {one_line(exc.__cause__ or exc)}"
        _write_summary(folder, case)
        return case
    for graph in graphs:
        found = bisect_program(graph.program, graph.reference, quiet, pm=pm, registry=registry, graph=graph.label)
        if found.first_bad is None:
            continue
        path = write_minimal(quiet, found, folder / "minimal.toml", model="program:factory", plugins=plugins)
        confirmed = confirm(path, graph.program, graph.reference, pm=pm, registry=registry,
                            expected=found.outcome.kind, bisection=found)
        case.first_bad_step = pipeline.where(found.first_bad)
        case.bad_kind = found.outcome.kind or ""
        case.minimal_pipeline = str(path)
        case.reproducer = confirmed.repro
        break
    else:
        case.note = ("every step agrees with the captured program: the difference is in capture or in "
                     "the runtime wrapper, not in a step")
    _write_summary(folder, case)
    return case


def _write_summary(folder: Path, case: Case) -> None:
    (folder / "case.json").write_text(json.dumps(case.to_json(), indent=2) + "\n", encoding="utf-8")
