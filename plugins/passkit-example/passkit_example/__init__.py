"""Own the passkit-example plugin: its hook implementations.

passkit loads this module through the ``passkit`` entry point named ``example`` (see
pyproject.toml). It registers one pattern set, ``example:gelu_tanh``, and one pipeline file,
``training-gelu-tanh``: the ``training-python`` pipeline with a ``rewrite`` step that applies the set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import passkit
from passkit_example.gelu_tanh import gelu_tanh_set

__all__ = ["PIPELINES_DIR", "gelu_tanh_set", "passkit_register_patterns", "passkit_register_pipelines"]

PIPELINES_DIR = Path(__file__).resolve().parent / "pipelines"


@passkit.hookimpl
def passkit_register_patterns() -> dict[str, Any]:
    # A factory: the patterns are traced only when a pipeline uses the set.
    return {"example:gelu_tanh": gelu_tanh_set}


@passkit.hookimpl
def passkit_register_pipelines() -> list[Path]:
    return sorted(PIPELINES_DIR.glob("*.toml"))
