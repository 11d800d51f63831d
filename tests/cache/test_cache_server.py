"""The shared compile cache on a real Redis server (``tests/redis_server.py``, never a mock):
signed entries load in a process with an empty folder and say they came from the server; an
unsigned, unknown-key or altered entry is never unpickled (one line, then a miss); without
trusted keys the server is written, not read, and ``passkit cache info`` says why; a server that
is down at the start, stops mid-run or stops while a process waits on it costs one line; a
truncated or evicted entry is a miss."""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import threading
import time
from pathlib import Path

import pytest
import redis
import torch
from click.testing import CliRunner

import passkit
from passkit.cache import entry as cache_entry
from passkit.cache.server import ENTRY_PREFIX, LEASE_PREFIX
from passkit.cli import main
from redis_server import free_port


def _keys(folder: Path) -> tuple[Path, Path]:
    result = CliRunner().invoke(main, ["cache", "keygen", str(folder)])
    assert result.exit_code == 0, result.output
    return folder / "passkit-cache.key", folder / "passkit-cache.pub"


def _compile(fn=lambda x: (x * 2.0).sin()):  # noqa: ANN001, ANN202
    """Compile and train ``fn`` (default ``sin(2x)``) through ``training-python``, compare with
    eager, and return its report."""
    compiled = passkit.aot_function(fn, pipeline="training-python")
    x = torch.randn(3, 4, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.func.grad(lambda y: fn(y).sum())(x.detach()))
    return compiled.passkit_reports[0]


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("passkit.cache") and r.levelno >= logging.WARNING]


@pytest.fixture
def cluster(tmp_path: Path, server, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001, ANN201
    """A server, a signing key pair, and a fresh empty folder per ``fresh()`` call."""
    url, _ = server
    private, public = _keys(tmp_path / "keys")
    monkeypatch.setenv("PASSKIT_CACHE_URL", url)
    count = iter(range(100))

    def fresh(signing: Path | None = private, trusted: Path | None = public) -> None:
        monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path / f"folder{next(count)}"))
        for name, value in (("PASSKIT_CACHE_SIGNING_KEY", signing), ("PASSKIT_CACHE_TRUSTED_KEYS", trusted)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, str(value))

    return redis.Redis.from_url(url), fresh, public


def _server_entry(client: redis.Redis) -> tuple[bytes, bytes]:
    (name,) = client.keys(ENTRY_PREFIX + "*")
    return name, client.get(name)


def test_a_signed_entry_loads_from_the_server_and_another_key_compiles_after_one_line(cluster, tmp_path, caplog) -> None:
    client, fresh, _ = cluster
    fresh(trusted=None)
    assert _compile().cache == "miss"
    fresh(signing=None)  # an empty folder and the public key: every graph from the server
    with caplog.at_level(logging.WARNING):
        loaded = _compile()
    assert (loaded.cache, loaded.source) == ("hit", "server")
    assert "loaded from the compile cache (server)" in loaded.table()
    assert _compile().source == "folder"  # the hit was copied into the folder
    _, other = _keys(tmp_path / "other")
    fresh(signing=None, trusted=other)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _compile().cache == "miss"
    name, blob = _server_entry(client)
    key = name.decode()[len(ENTRY_PREFIX):]
    signer = cache_entry.decode(blob, key, None).signer
    assert signer == (tmp_path / "keys" / "passkit-cache.pub").read_text().strip()
    assert _lines(caplog) == [f"passkit: not loading cache entry {key}.entry on the server: signed by {signer}, "
                              "a key this process does not trust; compiling"]


class _Planted:
    """Unpickling this runs code: it creates the file it names."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (Path.touch, (self.marker,))


def test_an_unsigned_or_altered_entry_on_the_server_is_never_unpickled(cluster, tmp_path, caplog) -> None:
    client, fresh, _ = cluster
    fresh(trusted=None)
    _compile()
    name, blob = _server_entry(client)
    key = name.decode()[len(ENTRY_PREFIX):]
    marker = tmp_path / "unpickled"
    planted = pickle.dumps(_Planted(marker))
    # An attacker who can write the server: an unsigned entry, and the signed one with its payload
    # swapped and its checksum made right again (only the signature can tell).
    header = len(cache_entry.MAGIC) + 8 + 32 + 64
    altered = blob[:header] + hashlib.sha256(planted).digest() + len(planted).to_bytes(8, "little") + planted
    for forged, why in ((cache_entry.encode(key, planted), "unsigned"),
                        (altered, "its signature by ed25519:")):
        client.set(name, forged)
        fresh(signing=None)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert _compile().cache == "miss"
        (line,) = _lines(caplog)
        assert line.startswith(f"passkit: not loading cache entry {key}.entry on the server: {why}")
        assert not marker.exists()
        assert client.get(name) == forged  # kept (another reader may trust it); this process signs nothing


def test_without_trusted_keys_the_server_is_written_not_read_and_cache_info_says_why(cluster) -> None:
    client, fresh, _ = cluster
    fresh(trusted=None)
    assert _compile().cache == "miss"
    fresh(trusted=None)
    assert _compile().cache == "miss"  # an empty folder, and the server not read
    # The second compile wrote the entry again (its report's step times differ, so its size may).
    _, blob = _server_entry(client)
    runner = CliRunner()
    data = json.loads(runner.invoke(main, ["cache", "info", "--json"]).stdout)["server"]
    why = "PASSKIT_CACHE_TRUSTED_KEYS is not set, and a server entry is loaded only when a trusted key signed it"
    assert data == {"url": data["url"], "reachable": True, "entries": 1, "bytes": len(blob), "read": False,
                    "why_not_read": why, "written": True, "why_not_written": "", "error": ""}
    text = runner.invoke(main, ["cache", "info"]).stdout.splitlines()
    assert text[-2].startswith(f"server: {data['url']}, reachable, 1 entries (")
    assert text[-1] == f"server read: no: {why}"


def test_without_a_signing_key_the_server_is_not_written(cluster) -> None:
    client, fresh, _ = cluster
    fresh(signing=None)
    assert _compile().cache == "miss"
    assert client.keys("*") == []
    text = CliRunner().invoke(main, ["cache", "info"]).stdout.splitlines()
    assert text[-1] == ("server written: no: PASSKIT_CACHE_SIGNING_KEY is not set, and no reader loads an unsigned "
                        "entry from the server")


def test_a_truncated_entry_is_deleted_and_an_evicted_one_is_a_miss(cluster, caplog) -> None:
    client, fresh, _ = cluster
    fresh()
    _compile()
    name, blob = _server_entry(client)
    key = name.decode()[len(ENTRY_PREFIX):]
    client.set(name, blob[: len(blob) // 2])
    fresh()
    with caplog.at_level(logging.WARNING):
        assert _compile().cache == "miss"
    kept, whole = len(blob) // 2 - cache_entry.HEADER, len(blob) - cache_entry.HEADER
    assert _lines(caplog) == [f"passkit: cache entry {key}.entry on the server is corrupt (truncated ({kept} of {whole} "
                              "bytes)); deleted it, compiling again"]
    assert cache_entry.decode(client.get(name), key, None)  # rewritten whole by the compile
    client.delete(name)  # what the server's own eviction does
    fresh()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _compile().cache == "miss"
    assert _lines(caplog) == []


def test_a_server_down_at_the_start_costs_one_line_and_the_folder_goes_on(tmp_path, monkeypatch, caplog) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    private, public = _keys(tmp_path / "keys")
    for name, value in (("PASSKIT_CACHE_URL", url), ("PASSKIT_CACHE_SIGNING_KEY", private), ("PASSKIT_CACHE_TRUSTED_KEYS", public)):
        monkeypatch.setenv(name, str(value))
    with caplog.at_level(logging.WARNING):
        assert _compile().cache == "miss"
        assert (_compile().cache, _compile().source) == ("hit", "folder")
        assert _compile(lambda x: x.cos() * 3.0).cache == "miss"
    (line,) = _lines(caplog)
    assert line.startswith(f"passkit: cache server {url} is unreachable (")
    assert line.endswith("); going on with the cache folder alone")


def test_a_server_that_stops_mid_run_costs_one_line(cluster, server, caplog) -> None:
    client, fresh, _ = cluster
    url, process = server
    fresh()
    assert _compile().cache == "miss"
    process.terminate()
    process.wait(10)
    with caplog.at_level(logging.WARNING):
        assert _compile(lambda x: x.cos() * 3.0).cache == "miss"
        assert _compile(lambda x: x.exp() * 3.0).cache == "miss"
        assert (_compile().cache, _compile().source) == ("hit", "folder")
    assert [line.split(" is unreachable")[0] for line in _lines(caplog)] == [f"passkit: cache server {url}"]


def test_a_server_that_stops_while_a_process_waits_on_it_costs_one_line_and_it_compiles(cluster, server, caplog) -> None:
    client, fresh, _ = cluster
    url, process = server
    fresh()
    assert _compile().cache == "miss"
    (name,) = client.keys(ENTRY_PREFIX + "*")
    client.delete(name)
    client.set(LEASE_PREFIX + name.decode()[len(ENTRY_PREFIX):], "elsewhere:1", px=600_000)  # another machine compiles it
    stopper = threading.Timer(2.0, process.terminate)
    fresh()
    started = time.monotonic()
    stopper.start()
    try:
        with caplog.at_level(logging.INFO, logger="passkit"):
            assert _compile().cache == "miss"  # compiled here, with the folder's lease, equal to eager
    finally:
        stopper.cancel()
    assert 2.0 <= time.monotonic() - started < 60  # it waited until the server went, then went on
    assert "waiting for elsewhere:1 to compile graph 1 (0 s) ..." in [r.getMessage() for r in caplog.records]
    assert [line.split(" is unreachable")[0] for line in _lines(caplog)] == [f"passkit: cache server {url}"]


def test_two_writers_of_one_key_leave_one_valid_entry(cluster, server) -> None:
    from passkit.cache.server import ServerStore
    from passkit.cache.signing import signing_key, trusted_keys

    _, fresh, _ = cluster
    fresh()
    key = "ab" * 32
    blobs = [cache_entry.encode(key, bytes([i]) * 3_000_000, signing_key()) for i in range(6)]
    store = ServerStore(server[0], readable=True)
    threads = [threading.Thread(target=store.put, args=(key, blob)) for blob in blobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = store.get(key)
    assert stored in blobs
    assert cache_entry.decode(stored, key, trusted_keys()).payload in [b[cache_entry.HEADER:] for b in blobs]
