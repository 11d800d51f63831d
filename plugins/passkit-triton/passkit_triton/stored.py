"""Own ``codegen.triton``'s compiled graphs and their compile-cache form.

A compiled graph is the fused graph with each region's ``call_module`` node turned into a call
of that region's :class:`~passkit_triton.launch.RegionLauncher`. Launchers hold kernels, which
do not pickle; what they are built from does: the fused graph (its nodes without their
metadata, and the region submodules and constants they name),
and for each region that runs a kernel a :class:`RegionKernels` (every kernel source it may
launch, written at compile time, and where its sizes come from). :class:`TritonGraph` keeps
both, and gives them to passkit's compile cache through ``passkit_cache_payload()``. On a cache
hit :func:`load` builds the launchers again and runs none of passkit's stages; the kernel files
are found again under the plugin's cache directory and Triton's own cache holds what it
compiled from them, so a warm start generates and compiles nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch.fx import Graph, GraphModule, Node

from passkit_triton.kernels import KernelSpec
from passkit_triton.launch import RegionLauncher

__all__ = ["LOADER", "RegionKernels", "TritonGraph", "build_graph", "load"]

LOADER = "passkit_triton.stored:load"
FORMAT = 2  # what an entry holds; a change makes older entries fail to load (and recompile)


@dataclass(frozen=True)
class RegionKernels:
    """One region's kernels: each (looped, wide) variant's source, and its domain's recipe."""

    specs: dict[tuple[bool, bool], KernelSpec]
    recipe: tuple[tuple[int, int] | int, ...]
    domain_rank: int


class TritonGraph:
    """A compiled graph: calls ``module``; ``passkit_cache_payload()`` says how to rebuild it."""

    def __init__(self, module: GraphModule, fused: GraphModule, regions: dict[str, RegionKernels], launch: dict[str, Any]) -> None:
        self.module = module
        self.fused = fused
        self.regions = regions
        self.launch = launch

    def __call__(self, *args: Any) -> Any:
        return self.module(*args)

    def launchers(self) -> list[RegionLauncher]:
        """The kernel launchers this graph calls, in graph order."""
        found = [getattr(node.target, "launcher", None) for node in self.module.graph.nodes]
        return [launcher for launcher in found if isinstance(launcher, RegionLauncher)]

    def passkit_cache_payload(self) -> tuple[str, Any]:
        # The fused graph without its metadata (fake tensors), over the modules and constants it
        # names; passkit's cache stores graph modules node by node, region submodules included.
        graph = Graph()
        graph.output(graph.graph_copy(self.fused.graph, {}))
        for node in graph.nodes:
            node.meta = {}
        named = {str(n.target): _attribute(self.fused, str(n.target)) for n in graph.nodes if n.op in ("call_module", "get_attr")}
        return LOADER, (FORMAT, GraphModule(named, graph), self.regions, self.launch)


def _attribute(module: GraphModule, target: str) -> Any:
    found: Any = module
    for part in target.split("."):
        found = getattr(found, part)
    return found


def _launcher(sub: GraphModule, kernels: RegionKernels, launch: dict[str, Any]) -> RegionLauncher:
    specs = kernels.specs
    return RegionLauncher(
        spec=specs[False, False],
        recipe=kernels.recipe,
        domain_rank=kernels.domain_rank,
        fallback=sub.forward,
        variant=lambda looped, wide: specs[looped, wide],
        **launch,
    )


def build_graph(fused: GraphModule, regions: dict[str, RegionKernels], launch: dict[str, Any]) -> TritonGraph:
    """A copy of ``fused`` whose kernel regions call their launchers (the rest run their ATen ops)."""
    graph = Graph()
    env: dict[Node, Node] = {}
    graph.output(graph.graph_copy(fused.graph, env))
    for node in graph.nodes:
        if node.op != "call_module" or str(node.target) not in regions:
            continue
        launcher = _launcher(fused.get_submodule(node.target), regions[str(node.target)], launch)

        def run_region(*inputs: Any, launcher: RegionLauncher = launcher) -> Any:
            return launcher(*inputs)

        run_region.__name__ = run_region.__qualname__ = f"triton_{node.target}"
        run_region.launcher = launcher  # type: ignore[attr-defined]
        node.op, node.target = "call_function", run_region
    return TritonGraph(GraphModule(fused, graph), fused, regions, launch)


def load(payload: Any) -> TritonGraph:
    """Rebuild a compiled graph from its cache payload (passkit's cache calls this on a hit)."""
    version, fused, regions, launch = payload
    if version != FORMAT:
        raise ValueError(f"a codegen.triton entry of format {version}, this plugin reads {FORMAT}")
    return build_graph(fused, regions, launch)
