"""Own ``joint.inductor_passes``: Inductor's joint-graph passes as a step of their own.

``torch.compile`` runs these on the joint graph before it partitions, and on an inference graph
before it compiles: ATen canonicalization, no-op removal, folding of tensors that hold one value,
and the pattern matcher's joint patterns (pointless view and permute pairs, attention to SDPA,
...). Inductor's code generator is tuned for graphs shaped by them. Without them it sees a
different graph: Hugging Face GPT-2 gave 24 C++ kernels instead of torch.compile's 21.
``training`` runs this step between ``joint`` and the partitioner. Each of those passes follows
Inductor's config, as in ``torch.compile`` (``pattern_matcher``, ``joint_graph_constant_folding``,
``joint_custom_pre_pass`` and ``joint_custom_post_pass``). Random ops stay ATen's, so
``codegen.inductor``'s ``fallback_random`` alone decides how dropout draws.
"""

from __future__ import annotations

from passkit import _torch
from passkit.errors import PassError
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program

__all__ = ["inductor_passes"]


def inductor_joint_context(_options: object) -> str:
    """What the compile cache key adds for this step: Inductor's config as these passes read it."""
    return _torch.inductor_config_digest(_torch.JOINT_PASSES_CONFIG)


@graph_pass("joint.inductor_passes", requires={"functional"}, cache_context=inductor_joint_context)
def inductor_passes(program: Program) -> bool:
    """Run the passes torch.compile runs on a joint graph (or an inference main) before partitioning."""
    name = next((n for n in ("joint", "main") if n in program.graphs), None)
    if name is None:
        raise PassError(
            f"joint.inductor_passes: no 'joint' or 'main' graph to simplify (graphs: {', '.join(program.graphs)}); "
            "run it before the partitioner"
        )
    gm = program.graphs[name]
    code = gm.code
    result = _torch.inductor_joint_graph_passes(gm)
    result.recompile()
    if result is not gm:
        program.set_graph(name, result, program.io(name))
    return result.code != code


@hookimpl
def passkit_register_passes() -> list:
    return [inductor_passes]
