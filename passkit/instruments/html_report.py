"""Own the HTML run report's data: a wrapper hookimpl that records each step for ``settings.report``.

With ``settings.report = "run.html"`` (or ``passkit run --report run.html``), every step that
runs adds one entry to its program's history: time, whether it changed the graphs, node counts
per graph, the step's figures (``record.stats``: saved bytes, pattern hits, ...), each changed
graph's code and, for a failing step, the error. The file is written again after every step
(``passkit.artifacts.html_page.render``), so it exists, and shows the failing step, when a run fails.
Every program (graph break, recompile) compiled in this process with the same report path gets
its own section of the same file. Registered after ``repro``, it is the outermost instrument.

``write_verdict`` (called by ``passkit.frontends.check.run_check`` once the run was compared with eager, or
when a step failed) puts the run's verdict at the top of the page: ok or mismatch, the max |diff|
of each output and gradient, the tolerance and the exit code.

A compile the compile cache answers runs no step; ``passkit_loaded_from_cache`` then writes the
program's section from the stored report: one row per step of the run that compiled it (its
times, changes and figures), each marked as loaded from the cache, node counts as totals over
the graphs (all the stored rows have), the captured code and the loaded graphs' code.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Generator

from passkit.artifacts.html_page import ALL_GRAPHS, ProgramHistory, StepEntry
from passkit.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext
    from passkit.core.program import Program
    from passkit.core.report import Verdict

__all__ = [
    "passkit_run_step", "passkit_loaded_from_cache", "write_verdict", "StepEntry", "ProgramHistory", "histories", "verdicts",
    "ALL_GRAPHS",
]

# Report path -> the programs written into it by this process, in order.
histories: dict[Path, list[ProgramHistory]] = {}
# Report path -> the verdict of the run that wrote it (the last one, for a path written twice).
verdicts: dict[Path, Verdict] = {}
_HISTORY_NOTE = "passkit.report_history"


def _codes(program: Program) -> dict[str, str]:
    return {name: gm.code for name, gm in program.graphs.items()}


def _history(context: StepContext, path: Path) -> ProgramHistory:
    program = context.program
    programs = histories.setdefault(path, [])
    index = program.notes.get(_HISTORY_NOTE)
    if isinstance(index, tuple) and index[0] == str(path) and index[1] < len(programs):
        return programs[index[1]]
    history = ProgramHistory(
        label=f"graph {len(programs) + 1}, {'training' if program.training else 'inference'}",
        pipeline=context.pipeline.label,
        training=program.training,
    )
    history.steps.append(StepEntry(0, "captured", "", nodes=_node_counts(program), codes=_codes(program)))
    programs.append(history)
    program.notes[_HISTORY_NOTE] = (str(path), len(programs) - 1)
    return history


def _node_counts(program: Program) -> dict[str, int]:
    return {name: len(gm.graph.nodes) for name, gm in program.graphs.items()}


@hookimpl(wrapper=True)
def passkit_run_step(context: StepContext) -> Generator[None, bool | None, bool | None]:
    """Record the step into its program's history and write the report file."""
    report = context.pipeline.settings.report
    if not report:
        return (yield)
    from passkit.artifacts.html_page import split_of

    path = Path(report).resolve()
    history = _history(context, path)
    before = _codes(context.program)
    entry = StepEntry(context.step.position + 1, context.step.id, context.pass_.name)
    history.steps.append(entry)
    try:
        return (yield)
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        entry.error = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        raise
    finally:
        program, record = context.program, context.record
        entry.seconds, entry.changed, entry.stats = record.seconds, context.graphs_changed, dict(program.stats)
        entry.nodes = _node_counts(program)
        entry.codes = {name: code for name, code in _codes(program).items() if before.get(name) != code}
        if "forward" in program.graphs and "backward" in program.graphs and entry.changed:
            history.split = split_of(program)
        _write(path)


def _write(path: Path) -> None:
    from passkit.artifacts.html_page import render

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(histories.get(path, []), verdicts.get(path)), encoding="utf-8")


def write_verdict(report: str | Path, verdict: Verdict) -> None:
    """Write the page at ``report`` again, with ``verdict`` at its top."""
    path = Path(report).resolve()
    verdicts[path] = verdict
    _write(path)


@hookimpl
def passkit_loaded_from_cache(pipeline: Any, program: Program, report: Any, captured: dict[str, Any]) -> None:
    """Write the section of a program the compile cache answered, from its stored report."""
    path = pipeline.settings.report
    if not path:
        return
    from passkit.artifacts.html_page import split_of

    path = Path(path).resolve()
    programs = histories.setdefault(path, [])
    history = ProgramHistory(
        label=f"graph {len(programs) + 1}, {'training' if program.training else 'inference'}",
        pipeline=pipeline.label, training=program.training, cache="hit",
    )
    total = sum(len(gm.graph.nodes) for gm in captured.values())
    history.steps.append(StepEntry(0, "captured", "", nodes={ALL_GRAPHS: total},
                                   codes={name: gm.code for name, gm in captured.items()}))
    ran = [record for record in report.records if record.status == "ran"]
    for record in ran:
        history.steps.append(StepEntry(
            record.position + 1, record.id, record.pass_name, seconds=record.seconds, changed=record.changed,
            nodes={ALL_GRAPHS: record.nodes_after}, stats=dict(record.stats), cached=True,
        ))
    if ran:  # the loaded graphs, as the last step that ran left them
        history.steps[-1].codes = {name: code for name, code in _codes(program).items()
                                   if history.steps[0].codes.get(name) != code}
    if "forward" in program.graphs and "backward" in program.graphs:
        history.split = split_of(program)
    programs.append(history)
    program.notes[_HISTORY_NOTE] = (str(path), len(programs) - 1)
    _write(path)
