"""A real ``redis-server`` for the shared-cache tests (``tests/redis_server.py``): skipped where
it is not installed, a failure in CI (``tests/dependencies.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from dependencies import require_module, require_program
from redis_server import INSTALL, redis_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A fresh server's URL and process (a test may stop it)."""
    require_module("redis", "pip install -e '.[dev]'")
    program = require_program("redis-server", "valkey-server", install=INSTALL)
    with redis_server(program, tmp_path / "redis") as found:
        yield found
