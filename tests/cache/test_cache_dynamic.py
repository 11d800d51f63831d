"""Programs with symbolic sizes are cached: a module (dropout, LayerNorm) trained on batch sizes 2, 3 and 4 compiles
a static graph and then one with a symbolic batch; a second process loads both (no passkit step,
no Inductor codegen) and computes the same values, and each hit's table gives its load time."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import passkit
from passkit.cache.store import CACHE_ENV

CHILD = Path(__file__).resolve().parents[1] / "cache_child.py"
ROOT = Path(__file__).resolve().parents[2]

def _run_child(tmp_path: Path) -> dict:
    env = {**os.environ, CACHE_ENV: str(tmp_path / "cache"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "CHILD_PIPELINE": "training"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, str(CHILD), "--dynamic"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_program_with_a_symbolic_batch_loads_in_a_fresh_process_and_reports_its_load_time(tmp_path: Path) -> None:
    cold = _run_child(tmp_path)
    warm = _run_child(tmp_path)
    assert cold["cache"] == ["miss", "miss"]  # batch 2, then one symbolic graph for batches 3 and 4
    assert warm["cache"] == ["hit", "hit"]
    assert warm["passes_run"] == 0
    assert warm["inductor"]["miss"] == 0 and warm["inductor"]["hit"] == 4  # two forwards, two backwards
    assert (cold["graphs_hashed"], warm["graphs_hashed"]) == (4, 0)  # found under the keys the cold process filed
    assert warm["values"] == cold["values"]  # dropout masks, outputs, gradients: bit for bit
    steps = passkit.load_pipeline("training").steps
    for cold_table, warm_table in zip(cold["tables"], warm["tables"]):
        cold_lines, warm_lines = cold_table.splitlines(), warm_table.splitlines()
        assert warm_lines[0].endswith(", cache hit: no step ran)")
        rows = warm_lines[3:-1]
        assert len(rows) == len(steps)
        # Every row's time cell is "-": the steps ran in the compiling process, not this one.
        for row in rows:
            assert re.match(r"^\s*\d+\s+\S+\s+\S+\s+(yes|no|skipped)\s+-\s", row), row
        compiled_in = re.search(r"([\d.]+ ms) in total$", cold_lines[-1]).group(1)
        assert re.fullmatch(
            rf"loaded from the compile cache in \d+\.\d ms, no step ran \(the process that compiled it ran "
            rf"{len(steps)} of {len(steps)} steps in {re.escape(compiled_in)}\)", warm_lines[-1]), warm_lines[-1]


def _compile_dynamic(rows: int) -> list[str]:
    """Compile ``(x * 2).sin()`` with a symbolic batch and train it on ``rows`` rows; the reports' cache marks."""
    compiled = passkit.compile(lambda x: (x * 2).sin(), pipeline="training-python", dynamic=True)
    x = torch.randn(rows, 3, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * torch.cos(2 * x))
    return [report.cache for report in compiled.passkit_reports], compiled


def _rewrite_guards(make_guard) -> str:  # noqa: ANN001 - the entry's stored guards become [make_guard(batch symbol)]
    from passkit import _torch

    from passkit.cache import store as cache
    (path,) = Path(os.environ[CACHE_ENV]).glob("*.entry")
    entry = _torch.loads_graphs(cache._decode(path.read_bytes()))
    first = next(n for n in entry["graphs"]["forward"].graph.nodes if n.op == "placeholder" and
                 isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim() == 2)
    entry["shape_guards"] = [make_guard(first.meta["val"].shape[0].node.expr)]
    path.write_bytes(cache._encode(_torch.dumps_graphs(entry)))
    return path.name


@pytest.mark.slow
def test_a_hit_brings_back_the_guards_its_compile_added_and_one_that_fails_compiles_again(caplog) -> None:
    import sympy

    assert _compile_dynamic(5)[0] == [""]
    _rewrite_guards(lambda batch: sympy.Eq(batch, 5))  # as if compiling had specialised on 5 rows
    marks, compiled = _compile_dynamic(5)
    assert marks == ["hit"]
    # The guard now holds in Dynamo's shape environment: 6 rows recompile instead of reusing the code.
    x = torch.randn(6, 3, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * torch.cos(2 * x))
    assert len(compiled.passkit_reports) == 2
    name = _rewrite_guards(lambda batch: sympy.Eq(batch, 99))
    with caplog.at_level(logging.INFO, logger="passkit.cache"):
        assert _compile_dynamic(5)[0] == [""]
    assert f"passkit: cache entry {name} was compiled under shape guards these sizes fail; compiling" in caplog.messages
