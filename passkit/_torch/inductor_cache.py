"""Own the compile-cache form of a ``codegen.inductor`` graph: plain-data graphs (the bodies of
outlined regions, ``invoke_subgraph``'s, included), static input specs, fakes with a shape
environment, symbolic inputs kept as fakes, and Inductor's config digest and FX cache counters.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.fx
from torch.fx import GraphModule
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._ops import HigherOrderOperator, OpOverload

__all__ = [
    "fakes_with_shape_env",
    "graph_codes",
    "graph_data",
    "graph_from_data",
    "inductor_cache_counts",
    "inductor_config_digest",
    "static_input_specs",
    "symbolic_inputs",
]


def static_input_specs(values: Sequence[Any]) -> list[Any] | None:
    """Picklable descriptions of graph inputs: for a tensor ``(size, stride, storage_offset,
    dtype, device, requires_grad)``, any other value as it is; None when a size is symbolic."""
    specs: list[Any] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            if type(value) not in (FakeTensor, torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
                return None  # a subclass or another layout is more than its sizes and strides
            parts = [*value.shape, *value.stride(), value.storage_offset()]
            if any(isinstance(p, torch.SymInt) for p in parts):
                return None
            specs.append(("tensor", tuple(value.shape), tuple(value.stride()), int(value.storage_offset()),
                          value.dtype, value.device, bool(value.requires_grad)))
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
        else:
            specs.append(("value", value))
    return specs


def symbolic_inputs(values: Sequence[Any]) -> list[Any] | None:
    """``values`` as they are when some size is symbolic and every tensor is a strided fake of
    one fake mode with a shape environment (the compile cache pickles them with that
    environment, guards and symbols included, through ``graph_pickle``); None otherwise."""
    modes = set()
    symbolic = False
    for value in values:
        if isinstance(value, torch.Tensor):
            if type(value) is not FakeTensor or value.layout != torch.strided:
                return None
            modes.add(id(value.fake_mode))
            if value.fake_mode.shape_env is None:
                return None
            symbolic = symbolic or any(isinstance(p, torch.SymInt)
                                       for p in (*value.shape, *value.stride(), value.storage_offset()))
        elif isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            symbolic = True
    return list(values) if symbolic and len(modes) <= 1 else None


def fakes_with_shape_env(specs: Sequence[Any]) -> list[Any]:
    """Fresh fake tensors for ``static_input_specs`` in a fake mode with a (static) shape
    environment, which Inductor's FX graph cache needs to key and look up a graph."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())
    values: list[Any] = []
    with mode:
        for spec in specs:
            if spec[0] != "tensor":
                values.append(spec[1])
                continue
            _, size, stride, offset, dtype, device, requires_grad = spec
            if offset == 0 and all(size):  # most inputs: one op, a quarter of ``as_strided``'s cost
                value = torch.empty_strided(size, stride, dtype=dtype, device=device)
            else:
                extent = offset + (1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0)
                value = torch.empty(max(extent, 1), dtype=dtype, device=device).as_strided(size, stride, offset)
            values.append(value.requires_grad_(requires_grad) if requires_grad else value)
    return values


_PLAIN = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


def _target_ref(target: Any) -> tuple[str, ...] | None:
    """``target`` by name: an ATen-style operator or a function found again by module and name."""
    import importlib

    if isinstance(target, str):
        return ("str", target)
    if isinstance(target, OpOverload):
        return ("op", target.namespace, target._opname, target._overloadname)
    if isinstance(target, HigherOrderOperator):  # ``invoke_subgraph`` calling a region's body
        found = getattr(torch.ops.higher_order, target.name(), None)
        return ("hop", target.name()) if found is target else None
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
    except Exception:  # noqa: BLE001 - not importable by name: not storable
        return None
    return ("fn", module, name) if found is target else None


def _resolve_target(ref: Sequence[str]) -> Any:
    import importlib

    if ref[0] == "str":
        return ref[1]
    if ref[0] == "op":
        return getattr(getattr(getattr(torch.ops, ref[1]), ref[2]), ref[3])
    if ref[0] == "hop":
        return getattr(torch.ops.higher_order, ref[1])
    found: Any = importlib.import_module(ref[1])
    for part in ref[2].split("."):
        found = getattr(found, part)
    return found


class _NotStorable(Exception):
    pass


def _arg_data(value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        return ("node", value.name)
    if isinstance(value, (list, tuple)):
        return ("list" if isinstance(value, list) else "tuple", [_arg_data(v) for v in value])
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return ("dict", [(k, _arg_data(v)) for k, v in value.items()])
    if isinstance(value, slice):
        return ("slice", [_arg_data(value.start), _arg_data(value.stop), _arg_data(value.step)])
    if isinstance(value, _PLAIN) or value is Ellipsis:
        return ("value", value)
    raise _NotStorable(type(value).__name__)


def _arg_value(data: Any, nodes: dict[str, torch.fx.Node]) -> Any:
    kind, body = data
    if kind == "node":
        return nodes[body]
    if kind in ("list", "tuple"):
        items = [_arg_value(v, nodes) for v in body]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {k: _arg_value(v, nodes) for k, v in body}
    if kind == "slice":
        return slice(*(_arg_value(v, nodes) for v in body))
    if kind == "value":
        return body
    raise ValueError(f"unknown argument kind {kind!r}")


def graph_data(gm: GraphModule) -> dict[str, Any] | None:
    """``gm`` as plain picklable data that ``graph_from_data`` rebuilds with the same node names,
    targets and arguments (so the same code); None when it calls something not found by name,
    holds a submodule or an argument of another kind. A graph module it reads with ``get_attr``
    (an outlined region's body, which ``invoke_subgraph`` calls) is stored the same way under
    its attribute name, and must be storable too. Node metadata is not kept."""
    nodes: list[Any] = []
    attrs: dict[str, Any] = {}
    bodies: dict[str, Any] = {}
    named: dict[int, str] = {}  # a body read under two names comes back as one module
    try:
        for node in gm.graph.nodes:
            target = _target_ref(node.target)
            if target is None or node.op == "call_module":
                return None
            if node.op == "get_attr":
                value = getattr(gm, node.target, None)
                if "." in node.target:
                    return None
                if isinstance(value, GraphModule):
                    if node.target not in bodies:
                        first = named.setdefault(id(value), node.target)
                        body = graph_data(value) if first == node.target else ("same as", first)
                        if body is None:
                            return None
                        bodies[node.target] = body
                elif isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                    attrs[node.target] = value.detach().clone()
                else:
                    return None
            nodes.append((node.op, node.name, target, _arg_data(node.args), _arg_data(node.kwargs)))
    except _NotStorable:
        return None
    return {"nodes": nodes, "attrs": attrs, "bodies": bodies, "class_name": type(gm).__name__}


def graph_from_data(data: dict[str, Any]) -> GraphModule:
    """The graph module ``graph_data`` described, its region bodies rebuilt as graph modules."""
    graph, made = torch.fx.Graph(), {}
    for op, name, target, args, kwargs in data["nodes"]:
        made[name] = graph.create_node(op, _resolve_target(target), _arg_value(args, made),
                                       _arg_value(kwargs, made), name=name)
    root = torch.nn.Module()
    for name, value in data["attrs"].items():
        setattr(root, name, value)
    bodies = data.get("bodies", {})
    for name, body in bodies.items():
        if not isinstance(body, tuple):
            setattr(root, name, graph_from_data(body))
    for name, body in bodies.items():
        if isinstance(body, tuple):
            setattr(root, name, getattr(root, body[1]))
    return GraphModule(root, graph, class_name=data.get("class_name", "GraphModule"))


def graph_codes(gm: GraphModule) -> dict[str, str]:
    """The code of ``gm`` (under ``""``) and of every graph module in it (region bodies, under
    their qualified names): what Inductor's FX graph cache keys a graph on."""
    return {name: module.code for name, module in gm.named_modules(remove_duplicate=False)
            if isinstance(module, GraphModule)}


def _portable(value: Any) -> Any:
    """A config value as stable text: objects by ``uuid()`` or qualified name, never address."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_portable(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, dict):
        return {str(k): _portable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    uuid = getattr(value, "uuid", None)
    if callable(uuid):
        return ["uuid", str(uuid())]
    kind = value if isinstance(value, type) or callable(value) else type(value)
    return ["object", getattr(kind, "__module__", ""), getattr(kind, "__qualname__", repr(kind))]


def inductor_config_digest(config_patches: dict[str, Any]) -> str:
    """sha256 of Inductor's whole config (as FX graph cache keys see it) with ``config_patches``
    applied, the CPU's vector capability and the thread count C++ kernels are split for: what
    else, besides the graph, decides what Inductor generates."""
    import hashlib
    import json

    from torch._inductor import config as inductor_config

    from passkit._torch.inductor_warm import cpu_capability

    with inductor_config.patch(config_patches):
        portable = _portable(inductor_config.save_config_portable())
        # C++ kernels split their loops for the thread count they were generated under, unless
        # told a count or to read it at run time (Inductor's own cache keys on it the same way).
        threads = torch.get_num_threads() if inductor_config.cpp.threads < 1 and not inductor_config.cpp.dynamic_threads else None
    portable = {"config": portable, "cpu_capability": cpu_capability(), "cpu_threads": threads}
    return hashlib.sha256(json.dumps(portable, sort_keys=True, default=repr).encode()).hexdigest()


def inductor_cache_counts() -> dict[str, int]:
    """This process's Inductor FX graph cache hits, misses and bypasses so far."""
    from torch._dynamo.utils import counters

    found = counters["inductor"]
    return {kind: int(found.get(f"fxgraph_cache_{kind}", 0)) for kind in ("hit", "miss", "bypass")}
