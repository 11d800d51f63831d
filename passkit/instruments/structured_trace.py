"""Own passkit's part of torch's structured trace: a wrapper hookimpl that emits each step.

When ``TORCH_TRACE`` is set (torch's structured trace is on), every step that runs emits its
report row (``passkit_NN_<step id>_record``, JSON) and the code of every graph it changed
(``passkit_NN_<step id>_<graph>``) or compiled (``passkit_NN_<step id>_<graph>_generated``: the
generated code, see ``dumps.generated_code``), and the first step also emits the captured graphs
(``passkit_00_captured_<graph>``). They are artifacts of the current Dynamo compile, so
``tlparse`` shows passkit's steps beside Dynamo's graphs for the same compile id. NN is the
step's 1-based number. Off, it costs one check per step.

A compile the compile cache answers runs no step; ``passkit_loaded_from_cache`` then emits the
captured graphs, every step's stored record (with ``"cache": "hit"``), the loaded graphs under
the last step that changed them and their generated code under the last step that ran.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Any, Generator

from passkit import _torch
from passkit.core.hookspecs import hookimpl
from passkit.instruments.dumps import generated_code

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext
    from passkit.core.program import Program

__all__ = ["passkit_run_step", "passkit_loaded_from_cache"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")


def _name(*parts: str) -> str:
    return "passkit_" + "_".join(_UNSAFE.sub("_", part) for part in parts)


@hookimpl(wrapper=True)
def passkit_run_step(context: StepContext) -> Generator[None, bool | None, bool | None]:
    """Emit the step's record and changed graphs into the structured trace."""
    if not _torch.structured_trace_enabled():
        return (yield)
    program = context.program
    if not context.previous:
        for graph, gm in program.graphs.items():
            _torch.trace_artifact(_name("00", "captured", graph), gm.code)
    before = {name: gm.code for name, gm in program.graphs.items()}
    compiled_before = dict(program.compiled)
    number = f"{context.step.position + 1:02d}"
    try:
        return (yield)
    finally:
        for graph, gm in program.graphs.items():
            if before.get(graph) != gm.code:
                _torch.trace_artifact(_name(number, context.step.id, graph), gm.code)
        for graph, fn in program.compiled.items():
            generated = generated_code(fn) if compiled_before.get(graph) is not fn else None
            if generated is not None:
                _torch.trace_artifact(_name(number, context.step.id, graph, "generated"), generated)
        record = dataclasses.asdict(context.record) | {"number": context.step.position + 1, "stats": dict(program.stats)}
        _torch.trace_artifact(_name(number, context.step.id, "record"), json.dumps(record, default=str), encoding="json")


@hookimpl
def passkit_loaded_from_cache(program: Program, report: Any, captured: dict[str, Any]) -> None:
    """Emit a cache hit's captured graphs, stored records and loaded graphs."""
    if not _torch.structured_trace_enabled():
        return
    for graph, gm in captured.items():
        _torch.trace_artifact(_name("00", "captured", graph), gm.code)
    ran = [record for record in report.records if record.status == "ran"]
    changed = [record for record in ran if record.changed]
    for record in ran:  # a skipped step emits nothing, as when it was compiled
        number = f"{record.position + 1:02d}"
        if changed and record is changed[-1]:  # the loaded graphs, as the last step to change them left them
            for graph, gm in program.graphs.items():
                _torch.trace_artifact(_name(number, record.id, graph), gm.code)
        if record is ran[-1]:
            for graph, fn in program.compiled.items():
                generated = generated_code(fn)
                if generated is not None:
                    _torch.trace_artifact(_name(number, record.id, graph, "generated"), generated)
        data = dataclasses.asdict(record) | {"number": record.position + 1, "cache": "hit"}
        _torch.trace_artifact(_name(number, record.id, "record"), json.dumps(data, default=str), encoding="json")
