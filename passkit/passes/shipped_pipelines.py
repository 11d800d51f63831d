"""Own the registration of the pipelines passkit ships (``passkit/pipelines/*.toml``).

The plugin manager registers this module after the built-in passes, so shipped pipelines go
through the same ``passkit_register_pipelines`` hook as a plugin's.
"""

from __future__ import annotations

from pathlib import Path

from passkit.core.hookspecs import hookimpl

__all__ = ["SHIPPED_DIR", "passkit_register_pipelines"]

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "pipelines"


@hookimpl
def passkit_register_pipelines() -> list[Path]:
    return sorted(SHIPPED_DIR.glob("*.toml"))
