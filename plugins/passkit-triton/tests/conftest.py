"""Run every Triton kernel in Triton's interpreter on the CPU; the ``triton_compile`` fixture.

``TRITON_INTERPRET`` is read when a kernel is created, so setting it here, before any test
compiles one, makes kernels run as NumPy on CPU tensors. Tests that need Triton skip (never
fail) when ``import triton`` fails; the fusion tests need only torch.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

from typing import Any, Callable  # noqa: E402

import pytest  # noqa: E402
from triton_helpers import pipeline_options  # noqa: E402

from passkit.testing import assert_pass_preserves_numerics  # noqa: E402


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
