"""Run every Triton kernel in Triton's interpreter on the CPU; the ``triton_compile`` fixture.

``TRITON_INTERPRET`` is read when a kernel is created, so setting it for each test (with
``monkeypatch``, so it never leaks into the rest of the worker's tests) makes the kernels that
test creates run as NumPy on CPU tensors. Triton also creates its own library's kernels
(``tl.sum`` and the rest) when ``triton.language`` is first imported, so that import happens
here, with the variable set only around it. Kernel sources go under the run's temp folder.
Tests that need Triton skip when ``import triton`` fails, except in CI (``CI`` set), where they
fail (``triton_helpers.require_module``); the fusion tests need only torch.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest
from triton_helpers import pipeline_options, require_module

from passkit.testing import assert_pass_preserves_numerics


def _import_triton_interpreted() -> None:
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    except ImportError:
        pass  # the tests that need it skip, or fail in CI (require_module)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


_import_triton_interpreted()


@pytest.fixture(autouse=True)
def _triton_interpreter(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # As for passkit's own tests: kernel sources under the run's temp folder, and a working
    # directory of the test's own, so nothing lands in the repository or the user's temp folder.
    monkeypatch.setenv("PASSKIT_TRITON_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "passkit-triton"))
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture
def triton_compile(make_program: Callable[..., Any]) -> Callable[..., Any]:
    """``triton_compile(fn, *inputs, fuse={...}, **codegen_options)`` -> an inference ``Program``.

    The program is functionalized, decomposed as ``inference-triton`` does, fused and compiled;
    ``program.compiled["main"]`` runs it.
    """
    require_module("triton")
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
