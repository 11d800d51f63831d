"""Shared test helpers live beside this file (``tiny_programs.py``); pytest puts this folder on
``sys.path`` because this conftest is here, so tests in sub-folders can import them too.

Every test starts from the same process state: no inherited ``PASSKIT_*`` variables, a fresh
process-wide plugin manager, no default ``torch.compile`` backend left by another test, no
Dynamo state (compiled frames, sizes seen) from another test, the same working directory and
torch's RNG state as before it ran, and an empty compile cache.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_process_state(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    from passkit import api, plugins

    for name in [key for key in os.environ if key.startswith("PASSKIT_")]:
        monkeypatch.delenv(name)
    # An empty compile cache of its own: no test reads another's entries, and the suite never
    # writes to the user's cache directory.
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path_factory.mktemp("passkit-cache")))
    cwd = os.getcwd()
    rng = torch.get_rng_state()
    plugins.reset()
    api._DEFAULT.clear()
    yield
    plugins.reset()
    api._DEFAULT.clear()
    # Dynamo remembers, per code object, which sizes changed between calls, and compiles the next
    # frame of that code (any nn.Sequential's forward) with dynamic sizes: another test's shapes
    # would change this test's graphs, and with them its compile-cache keys.
    torch._dynamo.reset()
    torch.set_rng_state(rng)
    os.chdir(cwd)


def pytest_report_header(config: pytest.Config) -> str:
    return "gpu tests: run (CUDA present)" if torch.cuda.is_available() else "gpu tests: deselected (no CUDA device)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` need a CUDA device: without one they are deselected, not skipped,
    so a skip in the summary always means coverage lost on a machine that should have it."""
    if torch.cuda.is_available():
        return
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if item.get_closest_marker("gpu") is None]
