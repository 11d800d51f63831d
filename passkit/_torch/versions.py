"""Which torch release passkit runs on: the one place that reads torch's version.

Every behaviour that differs between supported releases branches on one of these flags, named
for the release that changed it, so a search for ``TORCH_2_15`` lists everything torch 2.15
changed for passkit (docs/torch-versions.md keeps that list). Feature tests (``hasattr``,
``inspect.signature``) stay where an API's presence is the question; a flag is for a behaviour
that no attribute reveals.
"""

from __future__ import annotations

import torch

# The package exports only the version string (reports, reproducers); the flags are for
# ``passkit/_torch``'s own modules, which import them from here.
__all__ = ["TORCH_VERSION"]

# The range pyproject.toml declares, as (major, minor) bounds: first supported, first not.
SUPPORTED_TORCH = ((2, 11), (2, 16))


def torch_release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string: ``"2.15.0+cu132"`` is ``(2, 15)``."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


TORCH_VERSION: str = torch.__version__
TORCH_RELEASE = torch_release(TORCH_VERSION)
TORCH_2_14 = TORCH_RELEASE >= (2, 14)
TORCH_2_15 = TORCH_RELEASE >= (2, 15)
