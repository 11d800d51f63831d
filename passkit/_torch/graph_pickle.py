"""Own the faithful pickle of FX graph modules with their node metadata (the compile cache's form).

Pickling a ``GraphModule`` the ordinary way keeps only its generated code, and unpickling
re-traces that code symbolically: every node's metadata is gone (``val``, which the runtime
wrapper reads to find saved values that share a mutated input's storage), nodes are renamed,
and a call whose arguments are all constants runs at load time, so a factory followed by a
random op (``empty_strided`` then ``bernoulli_`` in dropout) becomes one fixed tensor.

``dumps`` writes each graph node by node instead: op, name, target, arguments and metadata.
Fake tensors in the metadata are written as torch's ``MetaTensorDesc`` (one describer for the
whole pickle, so two values that shared a storage or a tensor still do) and ``loads`` rebuilds
them with ``MetaConverter`` in one new fake mode, with a shape environment holding the one
they were traced in (symbolic sizes keep their symbols and hints). This is what torch's own
``torch.fx._graph_pickler`` does; that module imports Inductor, which would cost a cache hit of
``codegen.python`` seconds, so passkit keeps its own small form.

Unpickling runs pickle: only load entries you wrote, as with ``torch.load``.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from typing import Any

import torch
import torch.fx
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.meta_utils import MetaConverter, MetaTensorDescriber
from torch.fx import GraphModule
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from passkit._torch.executorch import edge_reduction

__all__ = ["MODULE_META", "dumps_graphs", "loads_graphs"]

_STATE = "passkit-unpickle-state"
# Metadata that names the user's classes or holds frames: not needed to run, not portable.
MODULE_META = frozenset({"nn_module_stack", "source_fn_stack", "fwd_source_fn_stack", "fwd_nn_module_stack"})


class _State:
    """What every value in one ``loads`` shares: its fake mode and meta converter."""

    def __init__(self, symbolic: bool) -> None:
        # A shape environment only where a symbolic size needs one: a static program's
        # values need none, and making one is not free.
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv() if symbolic else None)
        self.converter: MetaConverter[Any] = MetaConverter()


@dataclasses.dataclass(frozen=True)
class _NodeRef:
    """A reference from one node's arguments to an earlier node of the same graph."""

    name: str


def _op(namespace: str, name: str, overload: str | None) -> Any:
    packet = getattr(getattr(torch.ops, namespace), name)
    return packet if overload is None else getattr(packet, overload)


def _higher_order(name: str) -> Any:
    return getattr(torch.ops.higher_order, name)


def _fake(desc: Any, state: _State) -> FakeTensor:
    from torch.utils._mode_utils import no_dispatch

    def with_fake(make_meta: Any, device: Any) -> FakeTensor:
        with no_dispatch():
            return FakeTensor(state.fake_mode, make_meta(), device)

    return state.converter.meta_tensor(desc, state.fake_mode.shape_env, with_fake, None, None)


def _shape_env(fields: dict[str, Any], state: _State) -> ShapeEnv:
    env = state.fake_mode.shape_env
    for key, value in fields.items():
        setattr(env, key, value)
    return env


def _symint(expr: Any, env: ShapeEnv, pytype: type, hint: Any) -> torch.SymInt:
    from torch.fx.experimental.sym_node import SymNode

    return torch.SymInt(SymNode(expr, env, pytype, hint))


def _symbolic(kind: str, expr: Any, env: ShapeEnv, pytype: type, hint: Any) -> Any:
    """A symbolic float or bool (a saved ``1 / batch``, say) in the restored shape environment."""
    from torch.fx.experimental.sym_node import SymNode

    return {"float": torch.SymFloat, "bool": torch.SymBool}[kind](SymNode(expr, env, pytype, hint))


def _graph_module(fields: dict[str, Any], nodes: list[tuple[Any, ...]], codegen: Any) -> GraphModule:
    gm = GraphModule.__new__(GraphModule)  # a class of its own, as every graph module has
    gm.__dict__.update(fields)
    graph = torch.fx.Graph(owning_module=gm)
    made: dict[str, torch.fx.Node] = {}

    def resolve(value: Any) -> Any:
        return made[value.name] if isinstance(value, _NodeRef) else value

    for op, name, target, args, kwargs, type_, meta in nodes:
        args = torch.fx.node.map_aggregate(args, resolve)
        kwargs = torch.fx.node.map_aggregate(kwargs, resolve)
        node = graph.create_node(op, target, args, kwargs, name=name, type_expr=type_)
        if node.name != name:
            raise pickle.UnpicklingError(f"node {name!r} came back as {node.name!r}")
        node.meta = meta
        made[name] = node
    graph._codegen = codegen
    gm.graph = graph  # the setter recompiles the code from the nodes
    return gm


class _StateRef:
    """Pickled as a persistent reference that loads as the unpickler's ``_State``."""


class _Pickler(pickle.Pickler):
    def __init__(self, stream: io.BytesIO) -> None:
        super().__init__(stream, protocol=pickle.HIGHEST_PROTOCOL)
        self._describer = MetaTensorDescriber(copy_data=False)
        self.symbolic = False  # whether a shape environment was written

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _StateRef):
            return _STATE
        if isinstance(obj, FakeTensorMode):
            return "fake_mode"  # every fake value comes back in the loader's one fake mode
        return None

    def reducer_override(self, obj: Any) -> Any:  # noqa: PLR0911 - one case per kind
        if type(obj) in (int, float, str, bytes, bool, type(None), tuple, list, dict):
            return NotImplemented
        if isinstance(obj, FakeTensor):
            desc = self._describer.describe_tensor(obj)
            if desc.view_func is not None and type(desc.view_func).__name__ != "_FakeTensorViewFunc":
                raise pickle.PicklingError("a fake view made by a custom view function")
            return _fake, (desc, _StateRef())
        if isinstance(obj, GraphModule):
            return self._graph_module(obj)
        if isinstance(obj, OpOverload):
            return _op, (obj.namespace, obj._opname, obj._overloadname)
        edge = edge_reduction(obj)  # ExecuTorch's Edge ops and delegated modules
        if edge is not None:
            return edge
        if isinstance(obj, OpOverloadPacket):
            namespace, name = obj._qualified_op_name.split("::")
            return _op, (namespace, name, None)
        if isinstance(obj, HigherOrderOperator):
            return _higher_order, (obj.name(),)
        if isinstance(obj, ShapeEnv):
            self.symbolic = True
            fields = {k: v for k, v in vars(obj).items() if k not in ("tracked_fakes", "fake_tensor_cache")}
            return _shape_env, (fields, _StateRef())
        if isinstance(obj, torch.SymInt):
            node = obj.node
            return _symint, (node._expr, node.shape_env, node.pytype, node._hint)
        if isinstance(obj, (torch.SymFloat, torch.SymBool)):
            node = obj.node
            if node.shape_env is None:
                raise pickle.PicklingError(f"a {type(obj).__name__} outside a shape environment")
            kind = "float" if isinstance(obj, torch.SymFloat) else "bool"
            return _symbolic, (kind, node._expr, node.shape_env, node.pytype, node._hint)
        if isinstance(obj, torch.fx.Node):
            raise pickle.PicklingError("a node outside a graph's arguments")
        return NotImplemented

    def _graph_module(self, gm: GraphModule) -> Any:
        fields = {k: v for k, v in vars(gm).items() if k not in ("_graph", "_code")}
        refs = {node: _NodeRef(node.name) for node in gm.graph.nodes}

        def ref(value: Any) -> Any:
            return refs[value] if isinstance(value, torch.fx.Node) else value

        nodes = [
            (node.op, node.name, node.target, torch.fx.node.map_aggregate(node.args, ref),
             torch.fx.node.map_aggregate(node.kwargs, ref), node.type,
             {k: v for k, v in node.meta.items() if k not in MODULE_META})
            for node in gm.graph.nodes
        ]
        return _graph_module, (fields, nodes, gm.graph._codegen)


class _Unpickler(pickle.Unpickler):
    def __init__(self, stream: io.BytesIO, symbolic: bool) -> None:
        super().__init__(stream)
        self._state = _State(symbolic)

    def persistent_load(self, pid: Any) -> Any:
        if pid == _STATE:
            return self._state
        if pid == "fake_mode":
            return self._state.fake_mode
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def dumps_graphs(value: Any) -> bytes:
    """Pickle ``value``; graph modules in it are written node by node with their metadata.

    Raises ``pickle.PicklingError`` (or the error of an unpicklable attribute) for what cannot
    come back as it is."""
    with io.BytesIO() as stream:
        pickler = _Pickler(stream)
        pickler.dump(value)
        return (b"S" if pickler.symbolic else b"-") + stream.getvalue()


def loads_graphs(data: bytes) -> Any:
    """What ``dumps_graphs`` wrote, its fake values in one new fake mode."""
    with io.BytesIO(data[1:]) as stream:
        return _Unpickler(stream, symbolic=data[:1] == b"S").load()
