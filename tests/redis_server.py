"""A real ``redis-server`` for the shared compile cache's tests and its benchmark: started on a
free loopback port, in a folder of its own, with no persistence, and stopped afterwards. Never a
mock: Debian's ``redis-server`` (``apt-get install redis-server``; ``.ci/run`` installs it), or
Valkey's, which speaks the same protocol."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

__all__ = ["free_port", "redis_server", "INSTALL"]

INSTALL = "apt-get install redis-server"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def redis_server(program: str, folder: Path, *options: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """Start ``program`` (a ``redis-server`` path) in ``folder``; yield its ``redis://`` URL and
    process. ``options`` are extra ``--name value`` settings (``--maxmemory 1mb``)."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = subprocess.Popen(
        [program, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", "", "--appendonly", "no",
         "--protected-mode", "yes", *options],
        stdout=(folder / "redis.log").open("w"), stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {(folder / 'redis.log').read_text()[-2000:]}")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", server
    finally:
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
