"""Where kernels run: compiled by Triton on a GPU, in Triton's interpreter without one.

Without CUDA each test sets ``TRITON_INTERPRET=1`` for itself (through ``monkeypatch``, so the
rest of the worker's tests never see it): the variable is read when a kernel is created, and the
launcher keeps interpreted and compiled kernels apart. Triton's own library (``tl.sum``,
``tl.sigmoid``) is created when ``triton`` is first imported, so without CUDA this file imports
it with the variable set, and then takes the variable away again. With CUDA nothing is forced:
the ``device`` fixture is ``"cuda"`` and kernels are compiled. Kernel sources go under the run's
temp folder, and each test runs in a working directory of its own. Tests that need Triton skip
when ``import triton`` fails, except in CI (``CI`` set), where they fail
(``triton_helpers.require_module``); the fusion tests need only torch.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

import pytest
import torch
from triton_helpers import pipeline_options, require_module

from passkit.testing import assert_pass_preserves_numerics

HAS_CUDA = torch.cuda.is_available()

if not HAS_CUDA and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    except ImportError:
        pass  # the tests that need it skip, or fail in CI (require_module)
    finally:
        del os.environ["TRITON_INTERPRET"]


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    # Compiled programs are cached: each test starts from an empty compile cache of its own.
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path_factory.mktemp("passkit-cache")))
    # As for passkit's own tests: kernel sources under the run's temp folder, and a working
    # directory of the test's own, so nothing lands in the repository or the user's temp folder.
    monkeypatch.setenv("PASSKIT_TRITON_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "passkit-triton"))
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture
def device() -> str:
    """Where the tests' tensors live: the GPU when there is one, else the CPU (interpreter)."""
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def triton_compile(make_program: Callable[..., Any], device: str) -> Callable[..., Any]:
    """``triton_compile(fn, *inputs, fuse={...}, **codegen_options)`` -> an inference ``Program``.

    The program is functionalized, decomposed as ``inference-triton`` does, fused and compiled;
    ``program.compiled["main"]`` runs it. Inputs are traced where they are: pass them on ``device``.
    """
    require_module("triton")
    from passkit_triton import codegen_triton, fuse_regions

    def build(fn: Callable[..., Any], *inputs: Any, fuse: dict[str, Any] | None = None, **options: Any) -> Any:
        program = make_program(fn, *inputs)
        assert_pass_preserves_numerics("decompose", program, **pipeline_options("inference-triton", "decompose"))
        fuse_regions(program, **(fuse or {}))
        program.facts.add("fused")
        codegen_triton(program, **options)
        return program

    return build
