"""Optional dependencies of the tests: skipped on a developer's machine that lacks one, a
failure in CI (``CI`` set), where every dependency must be installed so that no coverage goes
missing silently."""

from __future__ import annotations

import os
import shutil
from types import ModuleType

import pytest

__all__ = ["in_ci", "require_module", "require_program"]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(what: str, install: str) -> None:
    message = f"{what} is not installed ({install})"
    if in_ci():
        pytest.fail(f"{message}; CI must have it, so this test fails rather than skips", pytrace=False)
    pytest.skip(message, allow_module_level=True)


def require_module(name: str, install: str = "") -> ModuleType:
    """``pytest.importorskip(name)``, except that in CI a module that fails to import fails the test."""
    try:
        return __import__(name, fromlist=["_"])
    except ImportError as exc:
        _missing(f"{name} ({exc})", install or f"pip install -e '.[dev]'")
        raise  # unreachable: _missing raises


def require_program(*names: str, install: str) -> str:
    """The path of the first of ``names`` found on PATH; skip (outside CI) or fail (in CI) if none is."""
    for name in names:
        found = shutil.which(name)
        if found is not None:
            return found
    _missing(" or ".join(names), install)
    raise AssertionError("unreachable")
