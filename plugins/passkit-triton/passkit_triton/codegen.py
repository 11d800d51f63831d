"""Own ``codegen.triton``: one Triton kernel per fusion region, ATen calls for everything else.

Each graph is copied; every ``call_module`` node tagged ``fusion_region`` becomes a call to a
:class:`~passkit_triton.launch.RegionLauncher` for the region's kernels (every variant's source
is written here, at compile time), and the copy, a :class:`~passkit_triton.stored.TritonGraph`,
is the graph's compiled callable, which passkit's compile cache can store. Ops outside regions
stay ATen calls, as in ``codegen.python``. The program's own graphs are left as they are.

A region runs as a kernel only if every size of its domain can be read from its inputs at run
time (symbolic sizes become kernel arguments that way); otherwise, and for the run-time cases
the launcher lists, its ATen submodule runs, so results never depend on whether a kernel ran.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic
import torch
from torch.fx import GraphModule

import passkit
from passkit_triton.kernels import kernel_spec
from passkit_triton.stored import RegionKernels, TritonGraph, build_graph

__all__ = ["CodegenOptions", "codegen_triton", "compile_graph", "domain_recipe", "region_kernels"]


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


def region_kernels(sub: GraphModule, region: dict[str, Any], options: CodegenOptions) -> RegionKernels | None:
    """Every kernel one region may launch, or None when its sizes cannot be read at run time."""
    recipe = domain_recipe(sub, region["domain"])
    if recipe is None:
        return None
    rank = max(1, len(region["domain"]))
    specs = {(False, False): kernel_spec(sub, rank=rank, policy=options.dtype_policy)}
    loops = [False, True] if specs[False, False].has_reduction else [False]
    for looped in loops:
        for wide in (False, True):
            if (looped, wide) not in specs:
                specs[looped, wide] = kernel_spec(sub, rank=rank, policy=options.dtype_policy, looped=looped, wide=wide)
    return RegionKernels(specs=specs, recipe=recipe, domain_rank=len(region["domain"]))


def compile_graph(gm: GraphModule, options: CodegenOptions) -> tuple[TritonGraph, int, int]:
    """The compiled form of fused graph ``gm``; returns it, the kernel count and the rest."""
    regions: dict[str, RegionKernels] = {}
    aten_regions = 0
    for node in gm.graph.nodes:
        if node.op != "call_module" or "fusion_region" not in node.meta:
            continue
        kernels = region_kernels(gm.get_submodule(node.target), node.meta["fusion_region"], options)
        if kernels is None:
            aten_regions += 1
        else:
            regions[str(node.target)] = kernels
    launch = {name: getattr(options, name) for name in ("block_sizes", "num_warps", "autotune", "max_row")}
    return build_graph(gm, regions, launch), len(regions), aten_regions


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

    The report's ``kernels`` figure counts regions compiled to kernels, ``triton_kernels`` the
    distinct Triton kernels among them (equal regions share one), and ``aten_regions``
    those whose sizes could not be read from their inputs (they run their ATen ops instead).
    """
    options = CodegenOptions(
        num_warps=num_warps, block_sizes=block_sizes, autotune=autotune, dtype_policy=dtype_policy, max_row=max_row
    )
    kernels = aten_regions = 0
    sources: set[str] = set()
    for name, gm in program.graphs.items():
        compiled, count, rest = compile_graph(gm, options)
        kernels += count
        aten_regions += rest
        sources.update(launcher.spec.source for launcher in compiled.launchers())
        program.compiled[name] = compiled
    program.record_stat("kernels", kernels)
    program.record_stat("triton_kernels", len(sources))
    program.record_stat("aten_regions", aten_regions)
    return False
