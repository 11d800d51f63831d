"""A compile the compile cache answers is still recorded: ``--report`` writes every step's row,
marked as loaded from the cache; ``--dump`` writes every step's graphs (a dumping run does not
read the cache); the structured trace gets the same artifacts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import passkit
from passkit import _torch
from passkit.cache.store import CACHE_ENV

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = str(ROOT / "pipelines" / "training-python.toml")


def _passkit_run(tmp_path: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PASSKIT_")}
    env[CACHE_ENV] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "passkit", "run", PIPELINE, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _rows(page: str) -> list[str]:
    """Each step row of the report's table: its number, step id and pass."""
    return re.findall(r'<tr(?: class="failed")?><td class="num">(\d+)</td><td>([^<]*)</td><td>([^<]*)</td>', page)


@pytest.mark.slow
def test_a_cache_hit_still_writes_a_complete_report_marked_as_loaded(tmp_path: Path) -> None:
    first = _passkit_run(tmp_path, tmp_path / "cold", "--report", "run.html")
    second = _passkit_run(tmp_path, tmp_path / "warm", "--report", "run.html")
    assert "loaded from the compile cache" not in first.stdout + first.stderr
    assert "loaded from the compile cache" in second.stdout + second.stderr
    cold = (tmp_path / "cold" / "run.html").read_text()
    warm = (tmp_path / "warm" / "run.html").read_text()
    steps = [row for row in _rows(cold) if row[0] != "0"]
    assert len(steps) == len(passkit.load_pipeline("training-python").steps)
    assert _rows(warm) == _rows(cold)  # the captured row and every step's row, in order
    assert warm.count('<span class="cached">loaded from the compile cache</span>') == len(steps)
    assert "Loaded from the compile cache: no step ran in this process." in warm
    assert "loaded from the compile cache" not in cold
    assert "<summary>captured: graph <b>main</b></summary>" in warm
    assert "<summary>step 11 (codegen.python): graph <b>forward</b></summary>" in warm
    assert warm.count("<svg") == 2  # the timeline and the forward/backward split


@pytest.mark.slow
def test_a_second_dumping_run_writes_every_step_again(tmp_path: Path) -> None:
    _passkit_run(tmp_path, tmp_path / "cold", "--dump", "dumps")
    _passkit_run(tmp_path, tmp_path / "warm", "--dump", "dumps")

    def listing(folder: Path) -> list[str]:
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())

    cold, warm = listing(tmp_path / "cold" / "dumps"), listing(tmp_path / "warm" / "dumps")
    assert any("codegen" in name for name in cold)
    assert warm == cold


def test_a_cache_hit_emits_the_structured_trace_artifacts_of_the_compile(monkeypatch) -> None:
    emitted: list[str] = []
    monkeypatch.setattr(_torch, "structured_trace_enabled", lambda: True)
    monkeypatch.setattr(_torch, "trace_artifact", lambda name, *args, **kwargs: emitted.append(name))

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x.sin(), p=0.5, training=True) * 2

    x = torch.randn(4, 5, requires_grad=True)
    compiled = passkit.aot_function(f, pipeline="training-python")
    compiled(x)
    cold, emitted[:] = list(emitted), []
    again = passkit.aot_function(f, pipeline="training-python")
    again(x)
    assert (compiled.passkit_reports[0].cache, again.passkit_reports[0].cache) == ("miss", "hit")
    # The captured graphs, every step's record, the final graphs (where the last step to change
    # them put them in the compile) and the generated code: only intermediate graphs are missing.
    last = [r for r in compiled.passkit_reports[0].records if r.changed][-1]
    final = f"passkit_{last.position + 1:02d}_{last.id.replace('.', '_')}_"
    expected = [name for name in cold if "_captured_" in name or name.endswith(("_record", "_generated"))
                or (name.startswith(final) and not name.endswith("_record"))]
    assert sorted(emitted) == sorted(expected)
    assert "passkit_11_codegen_python_forward_generated" in emitted
    assert sum(name.endswith("_record") for name in emitted) == len(passkit.load_pipeline("training-python").steps)
