"""``planted.scale_add`` and ``planted.explode`` fixed: both leave the program alone. A
reproducer of the planted bugs must not reproduce with these."""

from __future__ import annotations

import passkit
from passkit.core.hookspecs import hookimpl


@passkit.graph_pass("planted.scale_add", requires={"functional"})
def scale_add(program: passkit.Program) -> bool:
    """Fixed: no longer scales anything."""
    return False


@passkit.graph_pass("planted.explode")
def explode(program: passkit.Program) -> bool:
    """Fixed: no longer raises."""
    return False


@hookimpl
def passkit_register_passes() -> list:
    return [scale_add, explode]
