"""Own every use of ExecuTorch (``executorch``, the optional dependency ``passkit[executorch]``):
lowering an ``ExportedProgram`` to the Edge dialect, delegating to a backend, writing the
``.pte``, and running one on the ExecuTorch runtime in this process.

Each function imports ExecuTorch when called, so passkit imports without it; ``require()`` says
in one line how to install it. The ``.pte`` records passkit's pipeline as constant methods
(``passkit_pipeline``, ``passkit_fingerprint``, ``passkit_version``): strings the runtime
hands back from a method of that name, so the record travels inside the file.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = [
    "EDGE_PARTITIONERS", "edge_empty_contiguous", "edge_lower", "edge_delegate", "edge_ops_in", "edge_op", "edge_reduction", "edge_verifiers", "executorch_missing",
    "flat_user_inputs", "is_edge_empty_strided", "load_pte_method", "pte_bytes", "pte_record", "run_pte", "set_runtime_threads",
]

EDGE_PARTITIONERS = ("xnnpack",)  # the backends passkit.to_executorch delegates to by name
INSTALL = 'pip install "passkit[executorch]"'


def executorch_missing() -> str | None:
    """Why ExecuTorch cannot be used here (one line with the install command), or None."""
    try:
        import executorch.exir  # noqa: F401
        import executorch.runtime  # noqa: F401
    except ImportError as exc:
        return f"ExecuTorch is not installed ({exc}); {INSTALL}"
    return None


def _config(check_ir: bool = True) -> Any:
    from executorch.exir import EdgeCompileConfig

    return EdgeCompileConfig(_check_ir_validity=check_ir)


def edge_lower(exported: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``exported`` (ATen) lowered to the Edge dialect by ExecuTorch's ``to_edge``."""
    from executorch.exir import to_edge

    return to_edge(exported, compile_config=_config()).exported_program()


def _partitioner(name: str) -> Any:
    if name == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return XnnpackPartitioner()
    raise ValueError(f"unknown ExecuTorch partitioner {name!r}; passkit knows {', '.join(EDGE_PARTITIONERS)}")


def edge_verifiers() -> list[Any]:
    """The verifier an Edge-dialect ``ExportedProgram`` is checked with (ExecuTorch's)."""
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    return [EXIREdgeDialectVerifier(_config(check_ir=False), class_only=True)]




def edge_delegate(edge: torch.export.ExportedProgram, partitioners: Sequence[str]) -> torch.export.ExportedProgram:
    """The Edge program ``edge`` with what each partitioner takes delegated to its backend.

    Handed over without the metadata that names the user's modules (the compile cache drops it
    too, so a compiled and a loaded program delegate alike). XNNPACK's ConvertToLinearPass takes
    the nodes of one ``nn.Linear`` (by that metadata) for a partition whose input is what enters
    them; after ``fx.cse`` one ``view`` feeds two modules' matmuls (Llama's gate and up
    projections), and the second linear was made from the 2-D view with its 3-D output's shape
    ("Attempting to broadcast a dimension of length 24"). Without it each ``mm`` becomes a
    linear by its own shapes."""
    from executorch.exir import EdgeProgramManager

    from passkit._torch.graph_pickle import MODULE_META

    for node in edge.graph.nodes:
        for key in MODULE_META & node.meta.keys():
            del node.meta[key]
    manager = EdgeProgramManager({"forward": edge}, compile_config=_config())
    for name in partitioners:
        manager = manager.to_backend(_partitioner(name))
    return manager.exported_program()


def edge_ops_in(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` is an Edge-dialect graph: it calls Edge operators (``exir_ops.edge...``)
    or delegated code, or no operator at all."""
    from executorch.exir.delegate import executorch_call_delegate
    from executorch.exir.dialects.edge._ops import EdgeOpOverload

    calls = [node.target for node in gm.graph.nodes if node.op == "call_function"]
    operators = [target for target in calls if isinstance(target, (torch._ops.OpOverload, EdgeOpOverload))]
    return not operators or any(isinstance(t, EdgeOpOverload) or t is executorch_call_delegate for t in calls)


def edge_reduction(value: Any) -> tuple[Any, tuple[Any, ...]] | None:
    """How the compile cache's pickler writes an ExecuTorch object of an Edge graph (``reduce``
    form), else None: an Edge op by name (its schema does not pickle), a delegated module by its
    parts, its Edge program with the verifier rebuilt (ExecuTorch makes the class per call).
    Checked by class name, so that a graph of ATen ops never imports ExecuTorch."""
    kind = type(value).__name__
    if kind == "EdgeOpOverload":
        op = value._op
        return edge_op, (op.namespace, op._opname, op._overloadname)
    if kind == "LoweredBackendModule":
        return _lowered_module, (value._original_exported_program, value._backend_id, value._processed_bytes,
                                 value._compile_specs, value._named_data_store_output, value.meta)
    if isinstance(value, torch.export.ExportedProgram) and any("EXIREdge" in v.__name__ for v in value.verifiers):
        return _edge_program, (value.graph_module, value.graph_signature, value.state_dict, value.range_constraints,
                               value.module_call_graph, value.constants, value.example_inputs)
    return None


def _lowered_module(program: Any, backend: str, processed: bytes, specs: Any, named_data: Any, meta: Any) -> Any:
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    module = LoweredBackendModule(program, backend, processed, specs, named_data)
    module.meta = meta
    return module


def _edge_program(gm: Any, signature: Any, state_dict: Any, ranges: Any, call_graph: Any, constants: Any,
                  examples: Any) -> torch.export.ExportedProgram:
    return torch.export.ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=signature, state_dict=state_dict, range_constraints=ranges,
        module_call_graph=call_graph, constants=constants, example_inputs=examples, verifiers=edge_verifiers(),
    )


def edge_op(namespace: str, name: str, overload: str) -> Any:
    from executorch.exir.dialects._ops import ops as exir_ops

    return getattr(getattr(getattr(exir_ops.edge, namespace), name), overload)


def is_edge_empty_strided(target: Any) -> bool:
    from executorch.exir.dialects._ops import ops as exir_ops

    return target is exir_ops.edge.aten.empty_strided.default


def edge_empty_contiguous() -> Any:
    """The Edge op that allocates a tensor in the default dim order (the runtime has its kernel)."""
    from executorch.exir.dialects._ops import ops as exir_ops

    return exir_ops.edge.dim_order_ops._empty_dim_order.default


def pte_bytes(edge: torch.export.ExportedProgram, record: dict[str, str]) -> bytes:
    """The ``.pte`` of an Edge program (delegated or not), ``record`` kept as constant methods."""
    from executorch.exir import EdgeProgramManager

    # The IR was checked when it was lowered; passkit's steps since then are checked by their facts.
    manager = EdgeProgramManager({"forward": edge}, constant_methods=dict(record), compile_config=_config(check_ir=False))
    return bytes(manager.to_executorch().buffer)


def _load(pte: bytes) -> Any:
    from executorch.runtime import Runtime

    return Runtime.get().load_program(pte)


def pte_record(pte: bytes, names: Sequence[str]) -> dict[str, str]:
    """The constant methods ``names`` of a ``.pte`` that has them (passkit's record)."""
    program = _load(pte)
    found = program.method_names
    return {name: str(program.load_method(name).execute([])[0]) for name in names if name in found}


def run_pte(pte: bytes, inputs: Sequence[Any]) -> list[Any]:
    """Run the ``.pte``'s ``forward`` on the ExecuTorch runtime; ``inputs`` flattened as the
    program takes them (``flat_user_inputs``)."""
    return list(load_pte_method(pte).execute(list(inputs)))


def load_pte_method(pte: bytes) -> Any:
    """The ``.pte``'s ``forward``, loaded once (its ``execute`` for repeated runs). The method
    holds its program: the runtime's method reads the program's memory, and a program collected
    while its method runs is a crash (a segmentation fault), not an error."""
    program = _load(pte)
    method = program.load_method("forward")
    method.passkit_program = program
    return method


def set_runtime_threads(count: int) -> None:
    """Size the runtime's thread pool (XNNPACK's kernels run on it)."""
    from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool

    _unsafe_reset_threadpool(count)


def flat_user_inputs(exported: torch.export.ExportedProgram, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """``args`` and ``kwargs`` flattened in the order the program's user inputs take them
    (constants such as ``use_cache=False`` included, as ExecuTorch's method expects them)."""
    from torch.fx._pytree import tree_flatten_spec

    return list(tree_flatten_spec((tuple(args), dict(kwargs)), exported.call_spec.in_spec))
