"""Helpers shared by the passkit-triton tests: dtype tolerances, pipeline options, launchers."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Callable

import pytest
import torch

import passkit
from passkit_triton.launch import RegionLauncher

def require_module(name: str) -> ModuleType:
    """``pytest.importorskip(name)``, except that in CI (``CI`` set) a module that fails to import
    fails the test: CI installs the plugin with Triton, so a skip there would hide lost coverage."""
    try:
        return __import__(name)
    except ImportError as exc:
        message = f"{name} is not installed ({exc}); pip install -e plugins/passkit-triton"
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(f"{message}; CI must have it, so this test fails rather than skips", pytrace=False)
        pytest.skip(message, allow_module_level=True)
        raise  # unreachable: skip raises


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
    return program.compiled[graph].launchers()


def gpu(test: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a test that needs CUDA: ``gpu``, and skipped where there is none."""
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")(test))
