"""Own program files: write a ``Program`` to a folder and read it back without the user's model.

A folder written by ``write_program`` holds:

- ``graphs/<name>.py``: each graph's code, to read and diff;
- ``program.json``: the signature (every input and output, every graph's descriptors), the
  facts, the target opset's names and the fake inputs' metadata, as plain data;
- ``program.pkl``: the replayable record: every graph node by node (op, name, target,
  arguments, metadata), the same bookkeeping, and the fake inputs.

Fake values (``meta["val"]``, the example inputs) are stored as shape, stride, dtype, device and
``requires_grad``, and come back as fake tensors of one new fake mode. Node metadata that names
the user's own classes (``nn_module_stack``, ``source_fn_stack``) is dropped, so reading never
imports the user's code; only modules of Python, torch and passkit may appear in the record.
Reading runs pickle: only read folders you trust, as with ``torch.load``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import pickle
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import fx

from passkit import _torch
from passkit.core.program import Program, TargetOpset

if TYPE_CHECKING:
    from passkit.core.registry import Registry

__all__ = ["TensorMeta", "Unportable", "write_program", "read_program", "describe_value"]

RECORD = "program.pkl"
SUMMARY = "program.json"
# Modules a record may refer to: anything else would need the user's code to load.
PORTABLE_MODULES = frozenset({"builtins", "torch", "operator", "_operator", "math", "passkit", "collections", "typing", "enum"})


class Unportable(Exception):
    """The program refers to something that cannot be loaded without the user's code."""


@dataclass(frozen=True)
class TensorMeta:
    """What a (fake) tensor looks like, without its values."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: str
    requires_grad: bool

    @classmethod
    def of(cls, value: torch.Tensor) -> TensorMeta:
        sizes = (*value.shape, *value.stride())
        # int() on a SymInt would guard it to this call's value: a reproducer written for a
        # failing step must not specialize the user's dynamic shapes.
        if any(isinstance(size, torch.SymInt) for size in sizes):
            raise Unportable("a tensor has symbolic sizes")
        shape, stride = tuple(int(d) for d in value.shape), tuple(int(s) for s in value.stride())
        return cls(shape, stride, value.dtype, str(value.device), bool(value.requires_grad))

    def fake(self, mode: Any) -> torch.Tensor:
        with mode:
            value = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)
        return value.requires_grad_(True) if self.requires_grad else value

    def real(self, seed: int) -> torch.Tensor:
        """Seeded values in place of ones that were not saved: normal floats, zero integers."""
        generator = torch.Generator().manual_seed(seed)
        if self.dtype.is_floating_point or self.dtype.is_complex:
            value = torch.randn(self.shape, generator=generator, dtype=self.dtype)
        else:
            value = torch.zeros(self.shape, dtype=self.dtype)
        value = value.to(self.device)
        return value.requires_grad_(True) if self.requires_grad else value

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        grad = ", requires_grad" if self.requires_grad else ""
        return f"{dtype}{list(self.shape)} on {self.device}{grad}"


def describe_value(value: Any) -> str:
    """One line about an input: tensor metadata, or the Python value."""
    if isinstance(value, torch.Tensor):
        return str(TensorMeta.of(value))
    return repr(value)


_loading_modes: list[Any] = []


def _fake_from_meta(meta: TensorMeta) -> torch.Tensor:
    return meta.fake(_loading_modes[-1])


def _op_from_name(name: str) -> Any:
    target: Any = torch.ops
    for part in name.split("."):
        target = getattr(target, part)
    return target


class _Pickler(pickle.Pickler):
    """Pickle fake tensors as metadata and ops by name; refuse the user's own classes."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _torch.FakeTensor):
            return _fake_from_meta, (TensorMeta.of(obj),)
        name = _torch.op_name(obj)
        if name is not None:
            return _op_from_name, (name,)
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
            module = getattr(obj, "__module__", None) or ""
            if module.split(".")[0] not in PORTABLE_MODULES:
                raise Unportable(f"{module}.{getattr(obj, '__qualname__', obj)}")
        if isinstance(obj, torch.SymInt):
            raise Unportable("a symbolic size")
        return NotImplemented


def _dumps(value: Any) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


@dataclass
class _NodeRef:
    name: str


@dataclass
class _NodeRecord:
    op: str
    name: str
    target: Any
    args: Any
    kwargs: Any
    type: Any
    meta: dict[str, Any]


@dataclass
class _GraphRecord:
    nodes: list[_NodeRecord]
    codegen: Any
    attributes: dict[str, Any] = field(default_factory=dict)  # get_attr target -> tensor or _GraphRecord


@dataclass
class _ProgramRecord:
    graphs: dict[str, _GraphRecord]
    signature: Any
    facts: list[str]
    training: bool
    example_inputs: list[Any]
    target_opset: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None
    notes: dict[str, Any]
    dropped_meta: list[str]


def _portable_items(mapping: dict[str, Any], dropped: set[str]) -> dict[str, Any]:
    kept = {}
    for key, value in mapping.items():
        try:
            _dumps(value)
        except Exception:  # noqa: BLE001 - anything that will not load elsewhere stays behind
            dropped.add(key)
            continue
        kept[key] = value
    return kept


def _graph_record(gm: fx.GraphModule, dropped: set[str]) -> _GraphRecord:
    nodes, attributes = [], {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = _attribute(gm, node.target)
            if isinstance(value, fx.GraphModule):
                attributes[node.target] = _graph_record(value, dropped)
            elif isinstance(value, torch.Tensor) and not isinstance(value, _torch.FakeTensor):
                attributes[node.target] = value.detach()
            else:
                raise Unportable(f"graph attribute {node.target!r} is a {type(value).__name__}")
        if node.op == "call_module":
            raise Unportable(f"node {node.name} calls module {node.target!r}")
        to_ref = lambda n: _NodeRef(n.name)  # noqa: E731
        record = _NodeRecord(
            node.op, node.name, node.target, fx.node.map_arg(node.args, to_ref), fx.node.map_arg(node.kwargs, to_ref),
            node.type, _portable_items(node.meta, dropped),
        )
        _dumps((record.target, record.args, record.kwargs))  # raises Unportable for a user function
        nodes.append(record)
    return _GraphRecord(nodes, _torch.graph_codegen(gm.graph), attributes)


def _attribute(gm: torch.nn.Module, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _graph_module(record: _GraphRecord) -> fx.GraphModule:
    root = torch.nn.Module()
    for target, value in record.attributes.items():
        owner = root
        *path, last = target.split(".")
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        setattr(owner, last, _graph_module(value) if isinstance(value, _GraphRecord) else value)
    graph = fx.Graph()
    env: dict[str, fx.Node] = {}

    def resolve(value: Any) -> Any:
        return fx.node.map_aggregate(value, lambda v: env[v.name] if isinstance(v, _NodeRef) else v)

    for rec in record.nodes:
        node = graph.create_node(rec.op, rec.target, resolve(rec.args), resolve(rec.kwargs), name=rec.name, type_expr=rec.type)
        node.meta.update(rec.meta)
        env[rec.name] = node
    graph.set_codegen(record.codegen)
    return fx.GraphModule(root, graph)


def _summary(program: Program) -> dict[str, Any]:
    signature = program.signature
    opset = program.target_opset
    return {
        "training": program.training,
        "facts": sorted(program.facts),
        "target_opset": None if opset is None else {"tables": list(opset.tables), "keep": list(opset.keep), "extra": list(opset.extra)},
        "inputs": [{**dataclasses.asdict(info), "value": describe_value(value)} for info, value in zip(signature.inputs, program.example_inputs)],
        "outputs": [dataclasses.asdict(info) for info in signature.outputs],
        "graphs": {
            name: {
                "nodes": len(gm.graph.nodes),
                "inputs": [str(d) for d in signature.graph_io[name].inputs] if name in signature.graph_io else [],
                "outputs": [str(d) for d in signature.graph_io[name].outputs] if name in signature.graph_io else [],
            }
            for name, gm in program.graphs.items()
        },
    }


def write_program(program: Program, folder: Path, *, header: str = "") -> str | None:
    """Write ``program`` into ``folder``; return why it cannot be replayed, or None when it can.

    The code and the summary are always written; the replayable record only when every graph
    refers to nothing but Python, torch and passkit.
    """
    graphs_dir = folder / "graphs"
    graphs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, gm in program.graphs.items():
        (graphs_dir / f"{name}.py").write_text(f"# passkit program graph: {name}\n# {header}\n{gm.code}", encoding="utf-8")
    (folder / SUMMARY).write_text(json.dumps(_summary(program), indent=2, default=str) + "\n", encoding="utf-8")
    dropped: set[str] = set()
    opset = program.target_opset
    try:
        record = _ProgramRecord(
            graphs={name: _graph_record(gm, dropped) for name, gm in program.graphs.items()},
            signature=program.signature,
            facts=sorted(program.facts),
            training=program.training,
            example_inputs=list(program.example_inputs),
            target_opset=None if opset is None else (opset.tables, opset.keep, opset.extra),
            notes=_portable_items(program.notes, dropped),
            dropped_meta=sorted(dropped),
        )
        data = _dumps(record)
    except Unportable as exc:
        return f"the program refers to {exc}, which cannot be loaded without the user's code"
    (folder / RECORD).write_bytes(data)
    return None


@contextlib.contextmanager
def _loading(mode: Any) -> Iterator[None]:
    _loading_modes.append(mode)
    try:
        yield
    finally:
        _loading_modes.pop()


def read_program(folder: Path, registry: Registry) -> Program:
    """The program ``write_program`` wrote, with fake values in one new fake mode.

    Facts tied to compiled callables (``compiled``) are dropped: callables are not stored.
    """
    mode = _torch.new_fake_mode()
    with _loading(mode), open(folder / RECORD, "rb") as handle:
        record: _ProgramRecord = pickle.load(handle)  # noqa: S301 - a reproducer the user chose to replay
    graphs = {name: _graph_module(graph) for name, graph in record.graphs.items()}
    tied = {name for name, fact in registry.facts.items() if fact.tied_to_graphs}
    return Program(
        graphs=graphs,
        signature=record.signature,
        example_inputs=record.example_inputs,
        fake_mode=mode,
        facts=set(record.facts) - tied,
        training=record.training,
        target_opset=_target_opset(record.target_opset, registry),
        notes=record.notes,
    )


def _target_opset(names: tuple[tuple[str, ...], ...] | None, registry: Registry) -> TargetOpset | None:
    """Rebuild the decomposition table from its names, through the ``decompose`` pass's options."""
    if names is None:
        return None
    from passkit.passes.decompose import build_table

    tables, keep, extra = names
    options = registry.get_pass("decompose").options(registry=registry, tables=list(tables), keep=list(keep), extra=list(extra))
    table, kept = build_table(options.tables, options.keep, options.extra)
    return TargetOpset(tuple(tables), tuple(keep), tuple(extra), table=table, kept=frozenset(kept))
