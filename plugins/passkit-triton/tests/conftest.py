"""Run every Triton kernel in Triton's interpreter on the CPU, and share small helpers.

``TRITON_INTERPRET`` is read when a kernel is created, so setting it here, before any test
compiles one, makes kernels run as NumPy on CPU tensors. Tests that need Triton skip (never
fail) when ``import triton`` fails; the fusion tests need only torch.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

from typing import Any, Callable  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import passkit  # noqa: E402
from passkit.testing import assert_pass_preserves_numerics  # noqa: E402
from passkit_triton.launch import RegionLauncher  # noqa: E402

# What each dtype's result may differ from eager by (relative, absolute).
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def assert_close(actual: Any, expected: Any) -> None:
    """Compare with the tolerance of the expected value's dtype."""
    rtol, atol = TOLERANCES.get(expected.dtype, (0, 0))
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


def pipeline_options(pipeline: str, step_id: str) -> dict[str, Any]:
    """The options a shipped pipeline gives one of its steps."""
    (step,) = [s for s in passkit.load_pipeline(pipeline).steps if s.id == step_id]
    return dict(step.options)


def launchers(program: Any, graph: str = "main") -> list[RegionLauncher]:
    """The kernel launchers that a compiled graph calls, in graph order."""
    compiled = program.compiled[graph].__self__
    found = []
    for node in compiled.graph.nodes:
        launcher = getattr(node.target, "launcher", None)
        if isinstance(launcher, RegionLauncher):
            found.append(launcher)
    return found


@pytest.fixture
def triton_compile(make_program: Callable[..., Any]) -> Callable[..., Any]:
    """``triton_compile(fn, *inputs, fuse={...}, **codegen_options)`` -> an inference ``Program``.

    The program is functionalized, decomposed as ``inference-triton`` does, fused and compiled;
    ``program.compiled["main"]`` runs it.
    """
    pytest.importorskip("triton")
    from passkit_triton import codegen_triton, fuse_regions

    def build(fn: Callable[..., Any], *inputs: Any, fuse: dict[str, Any] | None = None, **options: Any) -> Any:
        program = make_program(fn, *inputs)
        assert_pass_preserves_numerics("decompose", program, **pipeline_options("inference-triton", "decompose"))
        fuse_regions(program, **(fuse or {}))
        program.facts.add("fused")
        options.setdefault("autotune", False)
        codegen_triton(program, **options)
        return program

    return build
