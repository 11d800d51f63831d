"""Own graph dumps: a wrapper hookimpl that writes each graph's code around the steps.

With ``settings.dump = "changed"`` a step that changed the graphs (by hash), or that compiled
them, writes every graph; with ``"all"`` every step that ran does. Each compiled graph (each
program) gets its own folder under ``dump_dir``, so graph breaks and recompiles never overwrite
each other: ``compile-<frame>_<n>`` after Dynamo's compile id when Dynamo is compiling, else
``graph-<n>`` counting the programs dumped into ``dump_dir`` by this process. Files are
``<folder>/NN-<step id>-<graph>.py``, NN being the step's 1-based number (as in the run table,
``passkit explain`` and progress lines); the program as it arrived is ``00-captured-<graph>.py``.
Each file is a header comment followed by the graph's code; after a step that compiled a graph
(a ``codegen`` step) the file shows the generated code instead, when the callable exposes it
(``generated_code``). Paths go into ``record.dumps`` (the captured files into the first step's
record, before its own).

A folder's dump files from an earlier process are deleted when this process first writes it,
so a folder always shows one run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generator

from passkit import _torch
from passkit.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext
    from passkit.core.program import Program

__all__ = ["passkit_run_step", "dump_program", "graph_folder", "generated_code"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_DUMP_FILE = re.compile(r"^\d\d-.*\.py$")
FOLDER_NOTE = "passkit.dump_folder"
# Folders this process has written, by dump_dir: a new program never reuses one.
_claimed: dict[Path, list[Path]] = {}


@hookimpl(wrapper=True)
def passkit_run_step(context: StepContext) -> Generator[None, bool | None, bool | None]:
    """Write graph code after the step when ``settings.dump`` asks for it."""
    settings = context.pipeline.settings
    mode = settings.dump
    if mode == "off":
        return (yield)
    program = context.program
    directory = graph_folder(program, Path(settings.dump_dir))
    if not context.previous:
        context.record.dumps.extend(dump_program(program, directory, "00-captured", "captured program"))
    compiled_before = dict(program.compiled)
    result = yield
    compiled = {name for name, fn in program.compiled.items() if compiled_before.get(name) is not fn}
    if mode == "all" or context.graphs_changed or compiled:
        number = context.step.position + 1
        stem = f"{number:02d}-{context.step.id}"
        header = f"step {number} ({context.step.id}), pass {context.pass_.name}"
        facts = context.facts_after()
        context.record.dumps.extend(dump_program(program, directory, stem, header, facts=facts, compiled=compiled))
    return result


def graph_folder(program: Program, root: Path) -> Path:
    """The program's own dump folder under ``root``, chosen (and emptied) on first use."""
    existing = program.notes.get(FOLDER_NOTE)
    if existing is not None and Path(existing).parent == root:
        return Path(existing)
    claimed = _claimed.setdefault(root.resolve(), [])
    compile_id = _torch.current_compile_id()
    base = f"compile-{_UNSAFE.sub('_', compile_id.replace('/', '_')).strip('_')}" if compile_id else f"graph-{len(claimed) + 1}"
    folder, n = root / base, 1
    while folder.resolve() in claimed:
        n += 1
        folder = root / f"{base}-{n}"
    claimed.append(folder.resolve())
    if folder.is_dir():
        for stale in folder.iterdir():
            if stale.is_file() and _DUMP_FILE.match(stale.name):
                stale.unlink()
    program.notes[FOLDER_NOTE] = str(folder)
    return folder


def generated_code(fn: Callable[..., Any]) -> str | None:
    """The source code a codegen step generated for a graph, when its callable exposes it:
    a ``GraphModule``'s method (``codegen.python``), or an object with ``source_code``
    (Inductor's compiled graphs) or ``passkit_source`` (any plugin's callable)."""
    owner = getattr(fn, "__self__", None)
    for candidate in (fn, owner):
        for attribute in ("passkit_source", "source_code"):
            text = getattr(candidate, attribute, None)
            if isinstance(text, str):
                return text
    code = getattr(owner, "code", None)
    return code if isinstance(code, str) and hasattr(owner, "graph") else None


def dump_program(
    program: Program,
    directory: Path,
    stem: str,
    header: str,
    *,
    facts: set[str] | None = None,
    compiled: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[str]:
    """Write one ``<stem>-<graph>.py`` file per graph of ``program``; return their paths.

    The header names the step, the graph, the facts that hold after the step, and what each
    placeholder and output is (its descriptor). For graphs in ``compiled`` the body is the
    generated code when it is available.
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for graph_name, gm in program.graphs.items():
        path = directory / f"{_UNSAFE.sub('_', stem)}-{_UNSAFE.sub('_', graph_name)}.py"
        io = program.signature.graph_io.get(graph_name)
        generated = generated_code(program.compiled[graph_name]) if graph_name in compiled else None
        kind = "generated code" if generated is not None else ("graph code; the generated code is not available" if graph_name in compiled else "")
        text = (
            f"# passkit dump: {header}\n"
            f"# graph: {graph_name} ({len(gm.graph.nodes)} nodes)" + (f", {kind}" if kind else "") + "\n"
            f"# facts: {', '.join(sorted(program.facts if facts is None else facts))}\n"
            + (f"# inputs: {', '.join(map(str, io.inputs))}\n# outputs: {', '.join(map(str, io.outputs))}\n" if io else "")
            + (generated if generated is not None else gm.code + _subgraph_code(gm))
        )
        path.write_text(text, encoding="utf-8")
        paths.append(str(path))
    return paths


def _subgraph_code(gm: Any) -> str:
    """The code of each subgraph a higher-order op of ``gm`` calls (``cond`` branches, ...)."""
    return "".join(
        f"\n# subgraph {name}\n{module.code}"
        for name, module in gm.named_modules()
        if name and hasattr(module, "graph") and hasattr(module, "code")
    )
