"""Own the objects passkit puts in Inductor's custom-pass slots, and the graph surgery they need.

Inductor takes one object per slot (``torch._inductor.config``): a ``CustomGraphPass`` for the
graph slots, a ``CustomPartitionerFn`` for ``custom_partitioner_fn``. Each object's ``uuid()``
enters Inductor's FX graph cache key (``torch/_inductor/codecache.py``), so it must change
whenever what the object does changes; passkit derives it from the steps' fingerprints
(``passkit.frontends.inductor_slots``). Here live only the torch-facing parts:

- ``MountedPass`` calls back with the graph's ``GraphModule`` and whether the compile is for
  inference (post-grad slots say so through ``CustomInferenceAwareGraphPass``, torch 2.12+);
- ``put_back`` writes a graph that passes replaced back into the ``Graph`` object Inductor
  holds, keeping its placeholders (Inductor and AOT Autograd hold on to them by identity and
  name);
- ``MountedPartitioner`` asks passkit which joint values to save and lets torch cut the graph
  around them (``_extract_fwd_bwd_modules``, as torch's own partitioners do), so forward and
  backward follow AOT Autograd's calling convention exactly (saved symbols first, then
  tensors, then every tangent).
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch._inductor import custom_graph_pass as _custom

__all__ = ["MountedPass", "MountedPartitioner", "put_back", "is_tangent", "is_sym_value", "inductor_caches_off",
           "inductor_cache_hits"]

# torch 2.12+ tells post-grad passes whether the compile is for inference.
_GraphPassBase: Any = getattr(_custom, "CustomInferenceAwareGraphPass", _custom.CustomGraphPass)


def inductor_caches_off() -> Any:
    """A context with Inductor's FX graph cache and AOT Autograd's cache off: every compile runs
    the slots (bisection changes which steps run without changing their uuids)."""
    import contextlib

    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    stack = contextlib.ExitStack()
    stack.enter_context(inductor_config.patch(fx_graph_cache=False))
    stack.enter_context(functorch_config.patch(enable_autograd_cache=False))
    return stack


def inductor_cache_hits() -> int:
    """How many times, in this process, Inductor's FX graph cache or AOT Autograd's cache answered
    a compile (torch's counters)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"]) + int(counters["aot_autograd"]["autograd_cache_hit"])


def is_tangent(node: torch.fx.Node) -> bool:
    """Whether a joint (or backward) placeholder is a tangent, by AOT Autograd's naming."""
    return node.op == "placeholder" and node.name.startswith("tangents")


def is_sym_value(value: Any) -> bool:
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


# The slot objects alive in this process, by slot and uuid: a copy made here by pickling (as
# AOTInductor copies its config) is the object itself; only another process gets a refusing one.
_LIVE: weakref.WeakValueDictionary[tuple[str, str], Any] = weakref.WeakValueDictionary()


class MountedPass(_GraphPassBase):  # type: ignore[misc]
    """A graph slot's object: runs ``run(gm, is_inference)`` on the graph Inductor hands over."""

    def __init__(self, slot: str, run: Callable[[torch.fx.GraphModule, bool | None], None], uuid: str,
                 keyed: Callable[[], None] | None = None) -> None:
        self.slot = slot
        self._run = run
        self._uuid = uuid
        self._keyed = keyed  # told each time a cache key takes the uuid: a compile is under way
        _LIVE[(slot, uuid)] = self

    def __call__(self, graph: torch.fx.Graph, is_inference: bool | None = None) -> None:
        gm = graph.owning_module
        if gm is None:
            raise RuntimeError(f"passkit slot {self.slot}: Inductor handed over a graph without its GraphModule")
        self._run(gm, is_inference)

    def uuid(self) -> str:
        if self._keyed is not None:
            self._keyed()
        return self._uuid

    def __reduce__(self) -> Any:
        # Inductor pickles its config for workers (and AOTInductor copies it in this process):
        # the passes only travel by their uuid, and find themselves again where they were made.
        return (_detached, (self.slot, self._uuid))

    def __repr__(self) -> str:
        return f"<passkit slot {self.slot} {self._uuid[:12]}>"


def _detached(slot: str, uuid: str) -> MountedPass:
    live = _LIVE.get((slot, uuid))
    if live is not None:
        return live

    def refuse(gm: torch.fx.GraphModule, is_inference: bool | None) -> None:
        raise RuntimeError(f"passkit slot {slot}: this copy was unpickled in another process; mount the file there")

    return MountedPass(slot, refuse, uuid)


class MountedPartitioner(_custom.CustomPartitionerFn):
    """The ``custom_partitioner_fn`` object: ``choose(joint, joint_inputs, num_fwd_outputs)``
    returns the names of the joint's nodes to save, and torch cuts the graph around them; None
    (the step did not run: bisection skipped it) leaves the cut to torch's own min-cut."""

    def __init__(self, choose: Callable[[torch.fx.GraphModule, Sequence[Any], int], list[str] | None], uuid: str,
                 keyed: Callable[[], None] | None = None) -> None:
        self._choose = choose
        self._uuid = uuid
        self._keyed = keyed
        _LIVE[("partition", uuid)] = self

    def __call__(
        self, gm: torch.fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        num_fwd_outputs = int(kwargs["num_fwd_outputs"])
        names = self._choose(gm, joint_inputs, num_fwd_outputs)
        if names is None:
            from torch._functorch.partitioners import min_cut_rematerialization_partition

            return min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        return cut_joint(gm, names, num_fwd_outputs, kwargs.get("static_lifetime_input_indices"))

    def uuid(self) -> str:
        if self._keyed is not None:
            self._keyed()
        return self._uuid

    def __reduce__(self) -> Any:
        # Inductor's cache key pickles the config, where this object sits: its uuid says it all
        # (AOT Autograd's cache keys the partitioner this way, never calling uuid()).
        if self._keyed is not None:
            self._keyed()
        return (_detached_partitioner, (self._uuid,))

    def __repr__(self) -> str:
        return f"<passkit partitioner {self._uuid[:12]}>"


def _detached_partitioner(uuid: str) -> MountedPartitioner:
    live = _LIVE.get(("partition", uuid))
    if live is not None:
        return live  # type: ignore[return-value]

    def refuse(gm: torch.fx.GraphModule, inputs: Sequence[Any], n: int) -> list[str]:
        raise RuntimeError("passkit slot partition: this copy was unpickled in another process; mount the file there")

    return MountedPartitioner(refuse, uuid)


def cut_joint(
    joint: torch.fx.GraphModule, saved_names: list[str], num_fwd_outputs: int, static_lifetime: Sequence[int] | None
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """Forward and backward of ``joint`` that save exactly the named nodes (torch's extraction)."""
    from torch._functorch import partitioners

    by_name = {node.name: node for node in joint.graph.nodes}
    missing = [name for name in saved_names if name not in by_name]
    if missing:
        raise RuntimeError(f"the partitioner saved values the joint graph lacks: {', '.join(missing[:5])}")
    chosen = [by_name[name] for name in dict.fromkeys(saved_names)]
    saved_sym = [n for n in chosen if is_sym_value(n.meta.get("val"))]
    saved_values = [n for n in chosen if n not in saved_sym]
    keywords: dict[str, Any] = {"saved_sym_nodes": saved_sym, "num_fwd_outputs": num_fwd_outputs}
    parameters = inspect.signature(partitioners._extract_fwd_bwd_modules).parameters
    if "static_lifetime_input_nodes" in parameters and static_lifetime:
        placeholders = [n for n in joint.graph.nodes if n.op == "placeholder"]
        from torch.utils._ordered_set import OrderedSet

        keywords["static_lifetime_input_nodes"] = OrderedSet(placeholders[i] for i in static_lifetime)
    forward, backward = partitioners._extract_fwd_bwd_modules(joint, saved_values, **keywords)
    keep_collectives = getattr(partitioners, "is_not_collective", None)  # newer torch only
    for gm in (forward, backward):
        if keep_collectives is not None:
            gm.graph.eliminate_dead_code(is_impure_node=keep_collectives)
        gm.recompile()
    return forward, backward


def put_back(target: torch.fx.GraphModule, graph: torch.fx.Graph, source: torch.fx.GraphModule) -> None:
    """Make ``graph`` (the object Inductor holds, owned by ``target``) compute what ``source``
    computes, keeping ``graph``'s placeholders; the counts of placeholders must match."""
    if source.graph is graph and target.graph is graph:
        return
    old_inputs = [n for n in graph.nodes if n.op == "placeholder"]
    new_inputs = [n for n in source.graph.nodes if n.op == "placeholder"]
    for node in reversed(list(graph.nodes)):
        if node.op != "placeholder":
            graph.erase_node(node)
    env = dict(zip(new_inputs, old_inputs, strict=True))
    result = None
    for node in source.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            result = node
            break
        env[node] = graph.node_copy(node, lambda n: env[n])
        if node.op == "get_attr":
            _copy_attr(source, target, str(node.target))
    if result is not None:
        graph.output(torch.fx.map_arg(result.args[0], lambda n: env[n]))
    graph._codegen = source.graph._codegen
    if target.graph is not graph:
        target.graph = graph
    target.recompile()


def _copy_attr(source: torch.fx.GraphModule, target: torch.fx.GraphModule, qualified: str) -> None:
    *path, name = qualified.split(".")
    owner_src: Any = source
    owner_dst: Any = target
    for part in path:
        owner_src = getattr(owner_src, part)
        if not hasattr(owner_dst, part):
            setattr(owner_dst, part, torch.nn.Module())
        owner_dst = getattr(owner_dst, part)
    value = getattr(owner_src, name)
    if isinstance(value, torch.nn.Module) and not hasattr(owner_dst, name):
        owner_dst.add_module(name, value)
    else:
        setattr(owner_dst, name, value)
