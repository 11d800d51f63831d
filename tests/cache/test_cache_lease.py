"""One compile per key: a process that misses a key another process is compiling waits for it,
with a progress line naming that process, and loads its entry; when the compiling process dies,
its lease goes (the folder's lock at once, the server's when its time to live runs out) and a
waiter compiles; none waits longer than ``[settings] cache_wait``. Processes started together
run the steps once, with a folder or with a real ``redis-server``."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch
from click.testing import CliRunner

import passkit
from passkit.cli import main

CHILD = Path(__file__).resolve().parents[1] / "cache_child.py"
ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _compile(**settings: object):  # noqa: ANN202
    """The program ``cache_child.compile_and_report`` compiles (the same key), trained once and
    compared with eager; its report."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))
    x = torch.randn(5, 6)
    compiled = passkit.compile(model, pipeline="training-python", **settings)
    torch.testing.assert_close(compiled(x), model(x))
    return compiled.passkit_reports[0]


def _hanging_compiler(**env: str) -> subprocess.Popen:
    """A process that compiles the program and stops inside writing its entry, lease held."""
    child = subprocess.Popen([sys.executable, str(CHILD), "--hang-in-write"], env=_env(**env),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing", child.stderr.read()
    return child


class _KillWhenWaiting(logging.Handler):
    """Kill ``child`` when this process logs that it waits for it: then, and not before (a
    loaded machine may take seconds to reach the cache), the waiter is known to be waiting."""

    def __init__(self, child: subprocess.Popen) -> None:
        super().__init__(logging.INFO)
        self.child, self.killed_at, self.first_step_at = child, 0.0, 0.0

    def emit(self, record: logging.LogRecord) -> None:
        if not self.killed_at and record.getMessage().startswith("waiting for "):
            self.child.send_signal(signal.SIGKILL)
            self.killed_at = time.monotonic()
        if self.killed_at and not self.first_step_at and record.getMessage().startswith("[1/"):
            self.first_step_at = time.monotonic()  # this process compiles: it has the lease


@contextlib.contextmanager
def _kill_when_waiting(child: subprocess.Popen) -> Iterator[_KillWhenWaiting]:
    handler = _KillWhenWaiting(child)
    logging.getLogger("passkit").addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger("passkit").removeHandler(handler)
        child.kill()
        child.wait(60)


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("passkit")]


def test_a_waiter_takes_over_at_once_when_the_folder_lock_holder_dies(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path / "cache"))
    child = _hanging_compiler(PASSKIT_CACHE_DIR=str(tmp_path / "cache"))
    with caplog.at_level(logging.INFO, logger="passkit"), _kill_when_waiting(child) as killer:
        report = _compile()
    assert report.cache == "miss" and 0 < killer.first_step_at - killer.killed_at < 30
    assert f"waiting for {socket.gethostname()}:{child.pid} to compile graph 1 (0 s) ..." in _messages(caplog)
    assert _compile().cache == "hit"


def test_a_dead_compilers_server_lease_expires_and_a_waiter_compiles(tmp_path, server, monkeypatch, caplog) -> None:
    url, _ = server
    CliRunner().invoke(main, ["cache", "keygen", str(tmp_path / "keys")])
    keys = {"PASSKIT_CACHE_URL": url, "PASSKIT_CACHE_SIGNING_KEY": str(tmp_path / "keys" / "passkit-cache.key"),
            "PASSKIT_CACHE_TRUSTED_KEYS": str(tmp_path / "keys" / "passkit-cache.pub"), "PASSKIT_CACHE_LEASE_SECONDS": "4"}
    child = _hanging_compiler(PASSKIT_CACHE_DIR=str(tmp_path / "other-machine"), **keys)
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.INFO, logger="passkit"), _kill_when_waiting(child) as killer:
        report = _compile()
    assert report.cache == "miss"
    # The lease outlived its holder until its time to live ran out (4 s, renewed every 4/3 s):
    # a lock would have let go at once.
    assert killer.first_step_at - killer.killed_at >= 2.0
    assert f"waiting for {socket.gethostname()}:{child.pid} to compile graph 1 (0 s) ..." in _messages(caplog)


def test_no_process_waits_longer_than_cache_wait(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path / "cache"))
    child = _hanging_compiler(PASSKIT_CACHE_DIR=str(tmp_path / "cache"))
    try:
        with caplog.at_level(logging.WARNING, logger="passkit.cache"):
            report = _compile(cache_wait=1)
    finally:
        child.kill()
        child.wait(60)
    assert report.cache == "miss"
    assert _messages(caplog) == [f"passkit: waited 1 s for {socket.gethostname()}:{child.pid} to compile graph 1; "
                                 "compiling it here too ([settings] cache_wait)"]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["folder", "server"])
def test_processes_started_together_run_the_steps_once(where, tmp_path, request) -> None:
    env = {"PASSKIT_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    if where == "server":
        url, _ = request.getfixturevalue("server")
        CliRunner().invoke(main, ["cache", "keygen", str(tmp_path / "keys")])
        env.update(PASSKIT_CACHE_URL=url, PASSKIT_CACHE_SIGNING_KEY=str(tmp_path / "keys" / "passkit-cache.key"),
                   PASSKIT_CACHE_TRUSTED_KEYS=str(tmp_path / "keys" / "passkit-cache.pub"))
    runs = []
    for number in range(3):
        if where == "server":  # each on its own machine, as far as the folder goes
            env["PASSKIT_CACHE_DIR"] = str(tmp_path / f"cache{number}")
        out = tmp_path / f"run{number}.json"
        runs.append((out, subprocess.Popen([sys.executable, "-m", "passkit", "run", "training-python", "--json", str(out)],
                                           env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    results = []
    for out, process in runs:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr  # equal to eager
        results.append((json.loads(out.read_text())["reports"][0], stderr))
    marks = sorted((report["cache"], report["source"]) for report, _ in results)
    assert marks == [("hit", where), ("hit", where), ("miss", "")]
    compiler = next(runs[i][1].pid for i, (report, _) in enumerate(results) if report["cache"] == "miss")
    waited = [stderr for report, stderr in results if report["cache"] == "hit"]
    assert any(f":{compiler} to compile graph 1 (" in stderr for stderr in waited), waited


def test_when_the_holder_gives_up_without_an_entry_its_waiters_compile_at_once(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path / "elsewhere"))
    _compile()
    (entry,) = (tmp_path / "elsewhere").glob("*.entry")
    key = entry.stem
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(folder))
    # A live process holds the key's lock, as a compiling process does, and then gives up (its
    # compile failed, or could not be stored) before it lets go.
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(folder / (key + '.lock'))!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(600)"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    timer = threading.Timer(1.5, (folder / f"{key}.gaveup").touch)
    timer.start()
    started = time.monotonic()
    try:
        with caplog.at_level(logging.INFO, logger="passkit"):
            assert _compile(cache_wait=300).cache == "miss"
    finally:
        timer.cancel()
        holder.kill()
        holder.wait(60)
    assert time.monotonic() - started < 120
    assert "passkit: another process compiled graph 1 without storing it; compiling it here too" in _messages(caplog)


def test_a_server_waiter_wakes_when_its_holder_lets_go_and_hardly_asks_the_server_meanwhile(tmp_path, server, monkeypatch,
                                                                                               caplog) -> None:
    import redis

    from passkit.cache.server import DONE_PREFIX, ENTRY_PREFIX, LEASE_PREFIX

    url, _ = server
    CliRunner().invoke(main, ["cache", "keygen", str(tmp_path / "keys")])
    for name, value in {"PASSKIT_CACHE_URL": url, "PASSKIT_CACHE_SIGNING_KEY": str(tmp_path / "keys" / "passkit-cache.key"),
                        "PASSKIT_CACHE_TRUSTED_KEYS": str(tmp_path / "keys" / "passkit-cache.pub"),
                        "PASSKIT_CACHE_DIR": str(tmp_path / "first-machine")}.items():
        monkeypatch.setenv(name, value)
    client = redis.Redis.from_url(url)
    heard = client.pubsub(ignore_subscribe_messages=True)
    heard.psubscribe(DONE_PREFIX + "*")
    assert _compile().cache == "miss"
    deadline, message = time.monotonic() + 10, None
    while message is None and time.monotonic() < deadline:  # the first answer is the subscription's own
        message = heard.get_message(timeout=1)
    assert message is not None and message["data"].decode() == f"{socket.gethostname()}:{os.getpid()}"  # the holder says it let go
    heard.close()
    # Another machine is compiling the key (its lease, no entry yet); it stores the entry and
    # lets go after 4 s.
    (name,) = client.keys(ENTRY_PREFIX + "*")
    blob, key = client.get(name), name.decode()[len(ENTRY_PREFIX):]
    client.delete(name)
    client.set(LEASE_PREFIX + key, "elsewhere:1", px=60_000)

    def let_go() -> None:
        client.set(name, blob)
        client.delete(LEASE_PREFIX + key)
        client.publish(DONE_PREFIX + key, "elsewhere:1")

    timer = threading.Timer(4.0, let_go)
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path / "second-machine"))
    before = client.info("stats")["total_commands_processed"]
    timer.start()
    try:
        with caplog.at_level(logging.INFO, logger="passkit"):
            report = _compile()
    finally:
        timer.cancel()
    asked = client.info("stats")["total_commands_processed"] - before
    assert (report.cache, report.source) == ("hit", "server")
    assert "waiting for elsewhere:1 to compile graph 1 (0 s) ..." in _messages(caplog)
    # Polling every 0.2 s asked about 80 times in 4 s; a subscribed waiter looks once a second.
    assert asked < 40, asked
