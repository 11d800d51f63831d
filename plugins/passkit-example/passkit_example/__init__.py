"""Own the passkit-example plugin: its hook implementations.

passkit loads this module through the ``passkit`` entry point named ``example`` (see
pyproject.toml). It registers one pass, ``example.remove_noops``, and one pipeline file,
``training-noops``: the ``training`` pipeline with the pass inserted after ``decompose``.
"""

from __future__ import annotations

from pathlib import Path

import passkit
from passkit.pass_api import Pass
from passkit_example.remove_noops import remove_noops

__all__ = ["PIPELINES_DIR", "passkit_register_passes", "passkit_register_pipelines", "remove_noops"]

PIPELINES_DIR = Path(__file__).resolve().parent / "pipelines"


@passkit.hookimpl
def passkit_register_passes() -> list[Pass]:
    return [remove_noops]


@passkit.hookimpl
def passkit_register_pipelines() -> list[Path]:
    return sorted(PIPELINES_DIR.glob("*.toml"))
