"""Own passkit's part of torch's structured trace: a wrapper hookimpl that emits each step.

When ``TORCH_TRACE`` is set (torch's structured trace is on), every step that runs emits its
report row (``passkit_NN_<step id>_record``, JSON) and the code of every graph it changed
(``passkit_NN_<step id>_<graph>``) or compiled (``passkit_NN_<step id>_<graph>_generated``: the
generated code, see ``dumps.generated_code``), and the first step also emits the captured graphs
(``passkit_00_captured_<graph>``). They are artifacts of the current Dynamo compile, so
``tlparse`` shows passkit's steps beside Dynamo's graphs for the same compile id. NN is the
step's 1-based number. Off, it costs one check per step.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING, Generator

from passkit import _torch
from passkit.hookspecs import hookimpl
from passkit.instruments.dumps import generated_code

if TYPE_CHECKING:
    from passkit.hookspecs import StepContext

__all__ = ["passkit_run_step"]

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
