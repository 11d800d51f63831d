"""Own the memory a graph that ``codegen.inductor`` compiles may write: the input mutations it
writes into their inputs itself, and the backward inputs whose memory it may reuse.

Both follow torch's AOT: a buffer's mutation (BatchNorm's running statistics) stays in the graph
and Inductor stores it in the kernel that computes it, and a saved activation that nothing else
reads once the backward starts is donated to the backward's own buffers.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.core.program import Program

__all__ = ["mutations_to_write", "write_mutations_in_graph", "donated_backward_inputs"]


def mutations_to_write(program: Program, name: str) -> dict[int, int]:
    """The graph's mutation outputs that Inductor can write into their input itself, by output
    slot: the placeholder each one overwrites.

    As torch's AOT keeps a buffer's mutation in the graph, Inductor then stores a BatchNorm's new
    running statistics straight into the buffers, in the kernel that computes them, instead of
    returning a new tensor for the runtime to copy back. Only plain data writes of values that
    need no gradient to inputs that need none qualify, and only when no other output shares the
    input's memory (a saved value must keep the old data). In an inference graph, which runs
    under ``no_grad``, so do writes made under ``no_grad`` to inputs that need one: a compiled
    optimizer step updates its parameters in the kernels that compute the update
    (``keep_inference_input_mutations``).
    """
    gm, io = program.graphs[name], program.io(name)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    position = {d.index: p for p, d in enumerate(io.inputs) if d.kind in ("param", "buffer", "user")}
    outputs = list(next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0])
    storages = [_torch.storage_of(n.meta.get("val")) if isinstance(n, Node) else None for n in outputs]
    # A new value that carries a gradient (``x.add_(w)`` into an input needing none) is copied
    # back by the runtime under autograd, so that the input gets its history as in eager.
    with_tangent = {d.index for d in program.io("backward").inputs if d.kind == "tangent"} if name == "forward" else set()
    written: dict[int, int] = {}
    for k, desc in enumerate(io.outputs):
        info = program.signature.inputs[desc.index] if desc.kind == "mutation" else None
        if info is None or info.mutates_metadata or not info.mutates_data or k in with_tangent:
            continue
        if info.requires_grad and not (name == "main" and info.mutated_under_no_grad):
            continue
        p = position.get(desc.index)
        target = _torch.storage_of(placeholders[p].meta.get("val")) if p is not None else None
        value = outputs[k]
        if target is None or not isinstance(value, Node) or value.op == "placeholder" or outputs.count(value) > 1:
            continue
        # A symbolic program's outputs include sizes (SymInts), which have no storage.
        if any(storage is not None and storage == target for storage in storages) or storages[k] is None:
            continue
        written[k] = p  # type: ignore[assignment]
    return written


def write_mutations_in_graph(gm: GraphModule, written: dict[int, int]) -> None:
    """Write each output in ``written`` into its input with ``copy_`` and drop it from the outputs."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = list(output.args[0])
    with gm.graph.inserting_before(output):
        for k, p in written.items():
            gm.graph.call_function(torch.ops.aten.copy_.default, (placeholders[p], values[k]))
    output.args = (tuple(v for k, v in enumerate(values) if k not in written),)
    gm.recompile()


def donated_backward_inputs(program: Program) -> list[int]:
    """The backward's inputs whose memory Inductor may reuse for its own buffers, by position.

    A saved tensor qualifies when nothing but the backward reads it once the backward starts:
    its storage is no forward input's (a parameter, a buffer, a mutated input), no visible
    forward output's (the caller holds those), no gradient's, and no other saved value's (a view
    saved beside its base would be overwritten while the base is still to be read). As in
    torch's AOT, this lets the backward write into activations that are dead by then instead of
    allocating. The runtime copies them first when the backward keeps its graph.
    """
    fw, bw = program.graphs["forward"].graph, program.graphs["backward"].graph
    fw_io, bw_io = program.io("forward"), program.io("backward")

    def storage(node: Any) -> Any:
        return _torch.storage_of(node.meta.get("val")) if isinstance(node, Node) else None

    fw_outputs = [storage(n) for n in next(n for n in reversed(fw.nodes) if n.op == "output").args[0]]
    held = {storage(n) for n in fw.nodes if n.op == "placeholder"}
    held |= {s for s, d in zip(fw_outputs, fw_io.outputs) if d.kind != "saved"}
    held.discard(None)  # a StorageWeakRef cannot be compared with None
    fw_saved = Counter(s for s, d in zip(fw_outputs, fw_io.outputs) if d.kind == "saved" and s is not None)
    fw_ok = {
        d.index for s, d in zip(fw_outputs, fw_io.outputs)
        if d.kind == "saved" and s is not None and s not in held and fw_saved[s] == 1
    }
    bw_inputs = [storage(n) for n in bw.nodes if n.op == "placeholder"]
    grads = {storage(n) for n in next(n for n in reversed(bw.nodes) if n.op == "output").args[0]} - {None}
    bw_saved = Counter(s for s, d in zip(bw_inputs, bw_io.inputs) if d.kind == "saved" and s is not None)
    return [
        k for k, (s, d) in enumerate(zip(bw_inputs, bw_io.inputs))
        if d.kind == "saved" and d.index in fw_ok and s is not None and s not in grads and bw_saved[s] == 1
    ]
