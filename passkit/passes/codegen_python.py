"""Own ``codegen.python``: turn every graph into a plain Python callable.

The callable is the graph's FX-generated ``forward``, called directly rather than through
``nn.Module.__call__`` so that no hook machinery runs per call. Later stages (memory planning,
fused regions run in Python) extend this module.
"""

from __future__ import annotations

from passkit.hookspecs import hookimpl
from passkit.pass_api import graph_pass
from passkit.program import Program

__all__ = ["codegen_python"]


@graph_pass("codegen.python", produces={"compiled"})
def codegen_python(program: Program) -> bool:
    """Compile every graph to the Python code FX generates for it."""
    for name, gm in program.graphs.items():
        gm.recompile()
        program.compiled[name] = gm.forward
    return False


@hookimpl
def passkit_register_passes() -> list:
    return [codegen_python]
