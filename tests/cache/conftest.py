"""A real ``redis-server`` for the shared-cache tests (``tests/redis_server.py``): skipped where
it is not installed, a failure in CI (``tests/dependencies.py``). Each test starts with no
server remembered as down and no untrusted-entry line remembered as written (the same program
has the same key in every test)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from dependencies import require_module, require_program
from redis_server import INSTALL, redis_server


@pytest.fixture(autouse=True)
def _forget_servers_and_refusals() -> Iterator[None]:
    from passkit.cache import store

    store._servers.clear()
    store._refused.clear()
    yield
    store._servers.clear()
    store._refused.clear()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A fresh server's URL and process (a test may stop it)."""
    require_module("redis", "pip install -e '.[dev]'")
    program = require_program("redis-server", "valkey-server", install=INSTALL)
    with redis_server(program, tmp_path / "redis") as found:
        yield found
