"""tools/torch-matrix: what it reads from the README, how it counts a pytest run, and its
one-line errors for bad input (exit 2) and for a torch pip cannot install (exit 3)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import asdict
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "torch-matrix"


@pytest.fixture(scope="module")
def matrix():
    loader = SourceFileLoader("torch_matrix", str(TOOL))
    spec = importlib.util.spec_from_loader("torch_matrix", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_it_runs_the_readmes_quick_start_and_its_pytest(matrix) -> None:
    first, second = matrix.quick_start_lines()
    assert matrix.split_pytest(first) == (first, None)
    assert matrix.split_pytest(second) == ("pip install -e plugins/passkit-triton", "pytest")


def test_it_counts_the_last_summary_after_its_start(matrix, tmp_path: Path) -> None:
    log = tmp_path / "log"
    earlier = "━━ progress bar\n=== 1 failed, 9 passed in 3s ===\n"
    log.write_text(earlier + "=== 3 failed, 1630 passed, 2 skipped, 14 xfailed, 1 error in 18m ===\n")
    counts = matrix.test_counts(log, len(earlier.encode()))
    assert counts == {"passed": 1630, "failed": 3, "skipped": 2, "xfailed": 14, "errors": 1}


def test_it_reads_the_step_times_step_time_py_writes(matrix) -> None:
    sys.path.insert(0, str(TOOL.parents[1] / "benchmarks"))
    try:
        from step_time import WorkloadResult
    finally:
        sys.path.pop(0)
    contenders = {"eager": {"median_ms": 200.0}, "inductor": {"median_ms": 180.0},
                  "passkit:training": {"median_ms": 150.0, "vs_inductor_paired": 0.92}}
    payload = json.loads(json.dumps({"workloads": {"large": asdict(WorkloadResult("large", 5, 1, contenders, []))}}))
    assert matrix.step_figures(payload) == {"training_ms": 150.0, "inductor_ms": 180.0, "vs_inductor_paired": 0.92}
    del contenders["inductor"]  # Inductor's compile failed: no ratio, not a crash
    assert matrix.step_figures({"workloads": {"large": asdict(WorkloadResult("large", 5, 1, contenders, []))}}) is None


def test_a_bad_version_is_one_line_and_exit_2(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, str(TOOL), "2.x", "--venvs", str(tmp_path)], capture_output=True, text=True)
    assert (run.returncode, run.stderr) == (2, "torch-matrix: '2.x' is not a torch version (e.g. 2.15.0)\n")


def test_a_torch_pip_cannot_install_is_one_line_and_exit_3(tmp_path: Path) -> None:
    # No index answers (PIP_NO_INDEX, no find-links): pip cannot give torch 2.99.0 either way.
    env = {"PATH": "/usr/bin:/bin", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, str(TOOL), "2.99.0", "--venvs", str(tmp_path / "venvs"), "--no-step-time",
                          "--json", str(tmp_path / "rows.json")], capture_output=True, text=True, env=env)
    assert run.returncode == 3, run.stderr
    (row,) = json.loads((tmp_path / "rows.json").read_text())
    assert row["installed"] is False
    assert row["error"].startswith("pip cannot install torch==2.99.0: ")
    assert "\n" not in row["error"]
    assert f"torch 2.99.0: {row['error']}" in run.stdout
