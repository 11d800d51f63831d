"""Programs with symbolic sizes are cached: a module (dropout, LayerNorm) trained on batch sizes 2, 3 and 4 compiles
a static graph and then one with a symbolic batch; a second process loads both (no passkit step,
no Inductor codegen) and computes the same values, and each hit's table gives its load time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import passkit
from passkit.cache import CACHE_ENV

CHILD = Path(__file__).with_name("cache_child.py")
ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run_child(tmp_path: Path) -> dict:
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "CHILD_PIPELINE": "training"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(CHILD), "--dynamic"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_program_with_a_symbolic_batch_loads_in_a_fresh_process_and_reports_its_load_time(tmp_path: Path) -> None:
    cold = _run_child(tmp_path)
    warm = _run_child(tmp_path)
    assert cold["cache"] == ["", ""]  # batch 2, then one symbolic graph for batches 3 and 4
    assert warm["cache"] == ["hit", "hit"]
    assert warm["passes_run"] == 0
    assert warm["inductor"]["miss"] == 0 and warm["inductor"]["hit"] == 4  # two forwards, two backwards
    assert warm["values"] == cold["values"]  # dropout masks, outputs, gradients: bit for bit
    steps = passkit.load_pipeline("training").steps
    for cold_table, warm_table in zip(cold["tables"], warm["tables"]):
        cold_lines, warm_lines = cold_table.splitlines(), warm_table.splitlines()
        assert warm_lines[0].endswith(", cache hit: no step ran)")
        rows = warm_lines[3:-1]
        assert len(rows) == len(steps)
        # Every row's time cell is "-": the steps ran in the compiling process, not this one.
        for row in rows:
            assert re.match(r"^\d+\s+\S+\s+\S+\s+(yes|no|skipped)\s+-\s", row), row
        compiled_in = re.search(r"([\d.]+ ms) in total$", cold_lines[-1]).group(1)
        assert re.fullmatch(
            rf"loaded from the compile cache in \d+\.\d ms, no step ran \(the process that compiled it ran "
            rf"{len(steps)} of {len(steps)} steps in {re.escape(compiled_in)}\)", warm_lines[-1]), warm_lines[-1]
