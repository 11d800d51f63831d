"""Own graph dumps: a wrapper hookimpl that writes each graph's code around the steps.

With ``settings.dump = "changed"`` a step that changed the graphs (by hash) writes every graph;
with ``"all"`` every step that ran does. Files are ``<dump_dir>/NN-<step id>-<graph>.py``, NN
being the step's 1-based position in the plan; the program as it arrived is written first as
``00-captured-<graph>.py``. Each file is a header comment followed by the graph's ``gm.code``,
so a reader can diff consecutive files to see what a step did. Paths go into
``record.dumps`` (the captured files into the first step's record, before its own).

Existing files in ``dump_dir`` are overwritten, never deleted: several programs (graph breaks)
may share one directory.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Generator

from passkit.hookspecs import hookimpl

if TYPE_CHECKING:
    from passkit.hookspecs import StepContext
    from passkit.program import Program

__all__ = ["passkit_run_step", "dump_program"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@hookimpl(wrapper=True)
def passkit_run_step(context: StepContext) -> Generator[None, bool | None, bool | None]:
    """Write graph code after the step when ``settings.dump`` asks for it."""
    settings = context.pipeline.settings
    mode = settings.dump
    if mode == "off":
        return (yield)
    directory = Path(settings.dump_dir)
    if not context.previous:
        context.record.dumps.extend(dump_program(context.program, directory, "00-captured", "captured program"))
    result = yield
    changed = context.graphs_changed
    if mode == "all" or changed:
        number = context.step.position + 1
        stem = f"{number:02d}-{context.step.id}"
        header = f"step {number} ({context.step.id}), pass {context.pass_.name}"
        facts = context.facts_after()
        context.record.dumps.extend(dump_program(context.program, directory, stem, header, facts=facts))
    return result


def dump_program(
    program: Program, directory: Path, stem: str, header: str, *, facts: set[str] | None = None
) -> list[str]:
    """Write one ``<stem>-<graph>.py`` file per graph of ``program``; return their paths.

    The header names the step, the graph, the facts that hold after the step, and what each
    placeholder and output is (its descriptor).
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for graph_name, gm in program.graphs.items():
        path = directory / f"{_UNSAFE.sub('_', stem)}-{_UNSAFE.sub('_', graph_name)}.py"
        io = program.signature.graph_io.get(graph_name)
        text = (
            f"# passkit dump: {header}\n"
            f"# graph: {graph_name} ({len(gm.graph.nodes)} nodes)\n"
            f"# facts: {', '.join(sorted(program.facts if facts is None else facts))}\n"
            + (f"# inputs: {', '.join(map(str, io.inputs))}\n# outputs: {', '.join(map(str, io.outputs))}\n" if io else "")
            + gm.code
        )
        path.write_text(text, encoding="utf-8")
        paths.append(str(path))
    return paths
