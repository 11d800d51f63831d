"""The compile cache's folder: a size limit with least-recently-used eviction (a hit counts as a
use), and what ``passkit cache info`` reports about it."""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import passkit
from passkit.cache.folder import CACHE_ENV, DEFAULT_MAX_BYTES, MAX_BYTES_ENV, max_bytes
from passkit.cli import main


def _scaled(factor: float):  # noqa: ANN202 - three programs with three keys (the constant is in the code)
    return lambda x: (x * factor).sin()


def _compile(factor: float) -> str:
    """Compile and run ``x * factor`` through ``training-python``; its report's cache mark."""
    compiled = passkit.aot_function(_scaled(factor), pipeline="training-python")
    x = torch.randn(3, 4, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.cos(x * factor) * factor)
    return compiled.passkit_reports[0].cache


def _entries() -> dict[Path, int]:
    return {path: path.stat().st_size for path in Path(os.environ[CACHE_ENV]).glob("*.entry")}


def test_past_the_size_limit_the_least_recently_used_entry_is_evicted_and_the_rest_load(monkeypatch, caplog) -> None:
    assert _compile(2.0) == "miss"
    (first,) = _entries()
    assert _compile(3.0) == "miss"
    (second,) = set(_entries()) - {first}
    now = time.time()
    os.utime(first, (now - 200, now - 200))  # written first...
    os.utime(second, (now - 100, now - 100))
    assert _compile(2.0) == "hit"  # ...but used last: the hit marks it
    assert first.stat().st_mtime > now - 10
    sizes = _entries()
    # Room for two entries of this size, not three.
    monkeypatch.setenv(MAX_BYTES_ENV, str(sizes[first] + sizes[second] + min(sizes.values()) // 2))
    with caplog.at_level(logging.INFO, logger="passkit.cache"):
        assert _compile(4.0) == "miss"
    assert not second.exists() and first.exists() and len(_entries()) == 2
    assert "passkit: evicted 1 least recently used cache entry to stay under the size limit" in caplog.messages
    assert _compile(2.0) == "hit" and _compile(4.0) == "hit"
    assert _compile(3.0) == "miss"  # evicted: compiled again


def test_an_entry_larger_than_the_limit_is_kept_until_the_next_write(monkeypatch) -> None:
    monkeypatch.setenv(MAX_BYTES_ENV, "1")
    assert _compile(2.0) == "miss"
    assert _compile(2.0) == "hit"
    (first,) = _entries()
    assert _compile(3.0) == "miss"
    assert list(_entries()) != [first] and len(_entries()) == 1


def test_the_limit_reads_sizes_with_units_and_rejects_anything_else(monkeypatch) -> None:
    monkeypatch.delenv(MAX_BYTES_ENV, raising=False)
    assert max_bytes() == DEFAULT_MAX_BYTES == 2 * 1024**3
    for value, expected in (("500MB", 500_000_000), ("1GiB", 1024**3), ("1000", 1000)):
        monkeypatch.setenv(MAX_BYTES_ENV, value)
        assert max_bytes() == expected
    for value in ("lots", "-5", "0"):
        monkeypatch.setenv(MAX_BYTES_ENV, value)
        with pytest.raises(ValueError) as caught:
            max_bytes()
        assert str(caught.value) == (f"PASSKIT_CACHE_MAX_BYTES: expected a positive size such as 2GiB, 500MB or "
                                     f"1000000, got {value!r}")


def test_a_malformed_limit_warns_once_per_write_and_the_compile_goes_on(monkeypatch, caplog) -> None:
    monkeypatch.setenv(MAX_BYTES_ENV, "lots")
    with caplog.at_level(logging.WARNING, logger="passkit.cache"):
        assert _compile(2.0) == "miss"
    assert caplog.messages == ["passkit: PASSKIT_CACHE_MAX_BYTES: expected a positive size such as 2GiB, 500MB or "
                               "1000000, got 'lots'; using the default, 2 GiB"]
    assert _compile(2.0) == "hit"


def test_cache_info_shows_the_folder_entries_size_limit_and_last_use(monkeypatch) -> None:
    monkeypatch.setenv(MAX_BYTES_ENV, "1GiB")
    folder = os.environ[CACHE_ENV]
    runner = CliRunner()
    empty = json.loads(runner.invoke(main, ["cache", "info", "--json"]).stdout)
    assert empty == {"directory": folder, "entries": 0, "bytes": 0, "max_bytes": 1024**3, "oldest_used": None,
                     "newest_used": None, "incomplete": 0, "refused": None, "signing_key": None,
                     "trusted_keys": [], "server": None}
    _compile(2.0)
    _compile(3.0)
    sizes = _entries()
    oldest, newest = sorted(sizes, key=lambda p: p.stat().st_mtime)
    os.utime(oldest, (1_700_000_000, 1_700_000_000))
    data = json.loads(runner.invoke(main, ["cache", "info", "--json"]).stdout)
    assert data == {
        "directory": folder, "entries": 2, "bytes": sum(sizes.values()), "max_bytes": 1024**3,
        "oldest_used": "2023-11-14T22:13:20+00:00", "newest_used": data["newest_used"], "incomplete": 0,
        "refused": None, "signing_key": None, "trusted_keys": [], "server": None,
    }
    assert datetime.fromisoformat(data["newest_used"]).timestamp() == pytest.approx(newest.stat().st_mtime, abs=1)
    text = runner.invoke(main, ["cache", "info"]).stdout.splitlines()
    assert text == [
        f"directory: {folder}",
        text[1],
        "size limit: 1.0 GiB (PASSKIT_CACHE_MAX_BYTES; least recently used entries are evicted past it)",
        f"last used: oldest 2023-11-14T22:13:20+00:00, newest {data['newest_used']}",
    ]
    assert text[1].startswith("entries: 2 (") and text[1].endswith(" KiB)")


def test_cache_info_with_a_malformed_limit_is_bad_input(monkeypatch) -> None:
    monkeypatch.setenv(MAX_BYTES_ENV, "lots")
    result = CliRunner().invoke(main, ["cache", "info"])
    assert result.exit_code == 2
    assert result.stderr == ("PASSKIT_CACHE_MAX_BYTES: expected a positive size such as 2GiB, 500MB or 1000000, "
                             "got 'lots'\n")
