"""Own ``codegen.triton``: one Triton kernel per fusion region, ATen calls for everything else.

Each graph is copied; every ``call_module`` node tagged ``fusion_region`` becomes a call to a
:class:`~passkit_triton.launch.RegionLauncher` for the region's kernel, and the copy's generated
Python is the graph's compiled callable. Ops outside regions stay ATen calls, as in
``codegen.python``. The program's own graphs are left as they are.

A region runs as a kernel only if every size of its domain can be read from its inputs at run
time (symbolic sizes become kernel arguments that way); otherwise, and for the run-time cases
the launcher lists, its ATen submodule runs, so results never depend on whether a kernel ran.
"""

from __future__ import annotations

from typing import Any, Callable, Literal

import pydantic
import torch
from torch.fx import Graph, GraphModule, Node

import passkit
from passkit_triton.kernels import KernelSpec, kernel_spec
from passkit_triton.launch import RegionLauncher

__all__ = ["CodegenOptions", "codegen_triton", "compile_graph", "domain_recipe"]


class CodegenOptions(pydantic.BaseModel):
    """Options of ``codegen.triton``, validated when the pipeline file loads."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    num_warps: int | None = pydantic.Field(default=None, ge=1, le=32)
    block_sizes: list[int] = pydantic.Field(default_factory=lambda: [1024, 256, 2048, 4096], min_length=1)
    autotune: bool = False
    dtype_policy: Literal["keep", "fp32"] = "fp32"
    max_row: int = pydantic.Field(default=16384, ge=1)

    @pydantic.field_validator("block_sizes", "max_row")
    @classmethod
    def _powers_of_two(cls, value: Any) -> Any:
        for size in value if isinstance(value, list) else [value]:
            if size < 1 or size & (size - 1):
                raise ValueError(f"{size} is not a power of 2")
        return value


def domain_recipe(sub: GraphModule, domain: list[str]) -> tuple[tuple[int, int] | int, ...] | None:
    """Where each domain size comes from at run time: ``(input, dim)``, a constant, or None."""
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    recipe: list[tuple[int, int] | int] = []
    for key in domain:
        if key.lstrip("-").isdigit():
            recipe.append(int(key))
            continue
        found = next(
            (
                (index, dim)
                for index, node in enumerate(placeholders)
                if isinstance(node.meta.get("val"), torch.Tensor)
                for dim, size in enumerate(node.meta["val"].shape)
                if str(size) == key
            ),
            None,
        )
        if found is None:
            return None
        recipe.append(found)
    return tuple(recipe)


def _variants(sub: GraphModule, rank: int, policy: Literal["keep", "fp32"]) -> Callable[[bool, bool], KernelSpec]:
    """The region's other kernels (looped rows, int64 offsets), each written when first needed."""
    made: dict[tuple[bool, bool], KernelSpec] = {}

    def variant(looped: bool, wide: bool) -> KernelSpec:
        if (looped, wide) not in made:
            made[looped, wide] = kernel_spec(sub, rank=rank, policy=policy, looped=looped, wide=wide)
        return made[looped, wide]

    return variant


def _region_callable(name: str, sub: GraphModule, region: dict[str, Any], options: CodegenOptions) -> tuple[Any, bool]:
    """The function the compiled graph calls for one region, and whether it runs a kernel."""
    recipe = domain_recipe(sub, region["domain"])
    launcher: Any = sub.forward
    if recipe is not None:
        rank = max(1, len(region["domain"]))
        launcher = RegionLauncher(
            spec=kernel_spec(sub, rank=rank, policy=options.dtype_policy),
            recipe=recipe,
            domain_rank=len(region["domain"]),
            fallback=sub.forward,
            block_sizes=options.block_sizes,
            num_warps=options.num_warps,
            autotune=options.autotune,
            max_row=options.max_row,
            variant=_variants(sub, rank, options.dtype_policy),
        )

    def run_region(*inputs: Any) -> Any:
        return launcher(*inputs)

    run_region.__name__ = run_region.__qualname__ = f"triton_{name}"
    run_region.launcher = launcher  # type: ignore[attr-defined]
    return run_region, recipe is not None


def compile_graph(gm: GraphModule, options: CodegenOptions) -> tuple[GraphModule, int, int]:
    """A copy of ``gm`` whose regions call kernels; returns it, the kernel count and the rest."""
    graph = Graph()
    env: dict[Node, Node] = {}
    graph.output(graph.graph_copy(gm.graph, env))
    kernels = aten_regions = 0
    for node in graph.nodes:
        if node.op != "call_module" or "fusion_region" not in node.meta:
            continue
        sub = gm.get_submodule(node.target)
        function, is_kernel = _region_callable(str(node.target), sub, node.meta["fusion_region"], options)
        node.op, node.target = "call_function", function
        kernels += is_kernel
        aten_regions += not is_kernel
    compiled = GraphModule(gm, graph)
    return compiled, kernels, aten_regions


@passkit.graph_pass("codegen.triton", requires={"fused"}, produces={"compiled"}, options=CodegenOptions)
def codegen_triton(
    program: passkit.Program,
    *,
    num_warps: int | None,
    block_sizes: list[int],
    autotune: bool,
    dtype_policy: str,
    max_row: int,
) -> bool:
    """Compile each fusion region to one Triton kernel; run everything else as ATen calls.

    The report's ``kernels`` figure counts regions compiled to kernels, and ``aten_regions``
    those whose sizes could not be read from their inputs (they run their ATen ops instead).
    """
    options = CodegenOptions(
        num_warps=num_warps, block_sizes=block_sizes, autotune=autotune, dtype_policy=dtype_policy, max_row=max_row
    )
    kernels = aten_regions = 0
    for name, gm in program.graphs.items():
        compiled, count, rest = compile_graph(gm, options)
        kernels += count
        aten_regions += rest
        program.compiled[name] = compiled.forward
    program.record_stat("kernels", kernels)
    program.record_stat("aten_regions", aten_regions)
    return False
