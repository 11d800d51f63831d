"""Own AOTInductor as ``passkit.package`` calls it: compiling an ``ExportedProgram`` into a
``.pt2`` package and loading one back.

``aoti_compile_and_package`` writes into the ``inductor_configs`` it is given, so each call
gets a copy.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

__all__ = ["aoti_package", "aoti_load"]


def aoti_package(exported: Any, path: str | Path, inductor_configs: dict[str, Any]) -> str:
    """Compile ``exported`` ahead of time into the package at ``path``; returns its path."""
    from torch._inductor import aoti_compile_and_package

    return str(aoti_compile_and_package(exported, package_path=str(path), inductor_configs=copy.copy(inductor_configs)))


def aoti_load(path: str | Path) -> Any:
    """The loaded package at ``path``: callable like the model, ``get_metadata()`` its metadata."""
    from torch._inductor import aoti_load_package

    return aoti_load_package(str(path))
