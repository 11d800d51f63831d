"""A planted bug for the fuzzing tests, importable as a plugin module (``--plugin planted_write_back``).

``planted.drop_write_back`` drops the write-back of every in-place write into a program input:
each ``mutation[i]`` output of the functional ``main`` graph returns input ``i`` as it came in,
so the runtime writes the old value back. The outputs stay right; only the input the caller
passed keeps its old value. Only comparing the inputs after the call catches it.
"""

from __future__ import annotations

import passkit
from passkit.core.hookspecs import hookimpl


@passkit.graph_pass("planted.drop_write_back", requires={"functional"})
def drop_write_back(program: passkit.Program) -> bool:
    """Miscompile on purpose: every mutated input keeps its old value."""
    if "main" not in program.graphs:
        return False
    gm = program.graphs["main"]
    io = program.signature.graph_io["main"]
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    inputs = {(desc.kind, desc.index): node for desc, node in zip(io.inputs, placeholders)}
    output = next(node for node in gm.graph.nodes if node.op == "output")
    values = list(output.args[0])
    changed = False
    for position, desc in enumerate(io.outputs):
        if desc.kind != "mutation":
            continue
        kind = program.signature.inputs[desc.index].kind
        original = inputs.get((kind, desc.index))
        if original is not None and values[position] is not original:
            values[position] = original
            changed = True
    if changed:
        output.args = (tuple(values),)
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return changed


@hookimpl
def passkit_register_passes() -> list:
    return [drop_write_back]
