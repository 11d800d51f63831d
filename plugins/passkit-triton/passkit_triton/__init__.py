"""Own the passkit-triton plugin: its hook implementations.

passkit loads this module through the ``passkit`` entry point named ``triton`` (see
pyproject.toml). It registers two passes, ``fuse.regions`` and ``codegen.triton``, the fact
``fused`` that the first establishes and the second requires, and two
pipeline files, ``training-triton`` and ``inference-triton``, which extend the built-in
``training-python`` and ``inference-python`` and swap their code generator. Only passkit's
public plugin API is used: ``passkit.graph_pass``, ``passkit.hookimpl``, ``passkit.Program``,
``passkit.Fact`` and ``passkit.PassError``.
Triton itself is imported only when a kernel is first compiled.
"""

from __future__ import annotations

from pathlib import Path

import passkit
from passkit_triton.codegen import codegen_triton
from passkit_triton.fuse import FUSED, fuse_regions

__all__ = [
    "PIPELINES_DIR",
    "codegen_triton",
    "fuse_regions",
    "passkit_register_facts",
    "passkit_register_passes",
    "passkit_register_pipelines",
]

PIPELINES_DIR = Path(__file__).resolve().parent / "pipelines"


@passkit.hookimpl
def passkit_register_passes() -> list[passkit.Pass]:
    return [fuse_regions, codegen_triton]


@passkit.hookimpl
def passkit_register_facts() -> list[passkit.Fact]:
    return [FUSED]


@passkit.hookimpl
def passkit_register_pipelines() -> list[Path]:
    return sorted(PIPELINES_DIR.glob("*.toml"))
