"""Shared test helpers live beside this file (``tiny_programs.py``); pytest puts this folder on
``sys.path`` because this conftest is here, so tests in sub-folders can import them too.

Every test starts from the same process state: no inherited ``PASSKIT_*`` variables, a fresh
process-wide plugin manager, no default ``torch.compile`` backend left by another test, no
Dynamo state (compiled frames, sizes seen) from another test, no reports or HTML report
histories of another test, torch's RNG state as before it ran, an empty compile cache, and a
working directory of its own (an empty temp folder), so whatever a test writes without naming
a folder never lands in the repository.

For the whole run (set once, before xdist starts its workers, which inherit it): Inductor's and
passkit's caches and Hypothesis's example database live under the run's temp folder, never in
``/tmp/torchinductor_$USER``, ``~/.cache/passkit`` or the repository; the OpInfo sweep's shard
rotates by date (the header says which ran). Each worker runs Inductor's CPU probes once, up front,
in the run's own Inductor cache folder: passkit starts them on a thread when a backend is built,
and a thread left running into the next test would probe in whatever temporary cache folder that
test makes and removes. Every test has a time limit (``pytest-timeout``):
``timeout`` in pyproject, ``SLOW_TIMEOUT`` for tests marked ``slow``, unless a test sets its own
``pytest.mark.timeout``.
"""

from __future__ import annotations

import datetime
import os
from typing import Iterator

import pytest
import torch

SLOW_TIMEOUT = 1200  # seconds; the default (pyproject's `timeout`) is for quick tests
SWEEP_SHARDS = 3


@pytest.hookimpl(trylast=True)  # after pytest's own tmp_path plugin has set up the run's temp folder
def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller set everything below, and the worker inherited it
    root = config._tmp_path_factory.getbasetemp()  # this run's temp folder (pytest-<n>)
    for variable, folder in (
        ("TORCHINDUCTOR_CACHE_DIR", "torchinductor"),
        ("PASSKIT_CACHE_DIR", "passkit-cache"),
        ("HYPOTHESIS_STORAGE_DIRECTORY", "hypothesis"),  # else ./.hypothesis in the repository
    ):
        os.environ[variable] = str(root / folder)
    if not os.environ.get("PASSKIT_SWEEP_SHARD"):
        # Chosen here, once, so that every worker collects the same entries.
        os.environ["PASSKIT_SWEEP_SHARD"] = f"{datetime.date.today().toordinal() % SWEEP_SHARDS}/{SWEEP_SHARDS}"


def pytest_report_header(config: pytest.Config) -> list[str]:
    sweep = os.environ.get("PASSKIT_SWEEP", "")
    if sweep in ("all", "full"):
        sweep_line = f"passkit OpInfo sweep: every entry (PASSKIT_SWEEP={sweep})"
    else:
        sweep_line = (
            f"passkit OpInfo sweep: shard {os.environ.get('PASSKIT_SWEEP_SHARD')} (rotates daily; PASSKIT_SWEEP_SHARD=k/{SWEEP_SHARDS} "
            "picks one, PASSKIT_SWEEP=all runs every entry) and every known gap"
        )
    gpu_line = "gpu tests: run (CUDA present)" if torch.cuda.is_available() else "gpu tests: deselected (no CUDA device)"
    # CI runs the suite under two torch releases; a failure's log says which one from its top.
    return [f"torch {torch.__version__}", sweep_line, gpu_line]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``slow`` tests get the longer timeout. Tests marked ``gpu`` need a CUDA device: without
    one they are deselected, not skipped, so a skip in the summary always means coverage lost on
    a machine that should have had it."""
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))
    if torch.cuda.is_available():
        return
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if item.get_closest_marker("gpu") is None]


@pytest.fixture(scope="session", autouse=True)
def _cpu_probes_answered() -> None:
    if not torch.cuda.is_available():
        from torch._inductor.cpu_vec_isa import valid_vec_isa_list

        valid_vec_isa_list()


@pytest.fixture(autouse=True)
def _isolated_process_state(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    from passkit.frontends import api
    from passkit.frontends import compile_options
    from passkit.core import plugins
    from passkit.instruments import dumps, html_report

    for name in [key for key in os.environ if key.startswith("PASSKIT_")]:
        monkeypatch.delenv(name)
    # An empty compile cache of its own: no test reads another's entries, and the suite never
    # writes to the user's cache directory.
    monkeypatch.setenv("PASSKIT_CACHE_DIR", str(tmp_path_factory.mktemp("passkit-cache")))
    # Reproducers into the test's own working directory, where tests look for them by a short
    # name; the user's default (the system temp folder) is tested with this variable removed.
    monkeypatch.setenv("PASSKIT_REPRO_DIR", "passkit-repro")
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    rng = torch.get_rng_state()
    plugins.reset()
    api._DEFAULT.clear()
    _forget_reports(compile_options, html_report, dumps)
    yield
    plugins.reset()
    api._DEFAULT.clear()
    _forget_reports(compile_options, html_report, dumps)
    # Dynamo remembers, per code object, which sizes changed between calls, and compiles the next
    # frame of that code (any nn.Sequential's forward) with dynamic sizes: another test's shapes
    # would change this test's graphs, and with them its compile-cache keys.
    torch._dynamo.reset()
    torch.set_rng_state(rng)


def _forget_reports(compile_options, html_report, dumps) -> None:  # noqa: ANN001
    compile_options._REPORTS.clear()
    html_report.histories.clear()
    dumps._claimed.clear()

