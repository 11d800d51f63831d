"""``settings.report`` writes one self-contained HTML page; Chromium renders it; tlparse shows
passkit's steps beside Dynamo's graphs."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import passkit
import planted_bugs
from dependencies import require_program

FIXED_TRAINING = str(Path(__file__).resolve().parents[1] / "debug" / "fixed_training.toml")

REPO = Path(__file__).resolve().parents[2]


def _train(report: Path, pipeline: str = FIXED_TRAINING) -> None:
    model, (x,) = planted_bugs.tiny()
    compiled = passkit.aot_module(model, pipeline=pipeline, report=str(report))
    compiled(x).sum().backward()


def test_the_report_shows_steps_node_counts_the_split_and_code_diffs(tmp_path) -> None:
    report = tmp_path / "run.html"
    _train(report)
    page = report.read_text()
    # Self-contained: no scripts, no external resources.
    assert "<script" not in page and not re.search(r'(src|href)="http', page)
    assert page.count("<svg") == 2  # the timeline and the forward/backward split
    assert "<h2>graph 1, training: pipeline " in page
    for step in ("functionalize", "decompose", "joint", "partition.default", "fx.cse", "fx.dce", "codegen.python"):
        assert f"<td>{step}</td>" in page
    assert "<th>forward nodes</th><th>backward nodes</th>" in page
    assert re.search(r"saved for the backward: \d+ values, [\d.]+ (B|KiB)", page)
    assert "<summary>step 3 (joint): graph <b>joint</b></summary>" in page
    assert '<span class="add">' in page and '<span class="del">' in page  # decompose's diff of main


def test_a_failing_step_is_in_the_report(register_passkit_plugin, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    (tmp_path / "planted.toml").write_text(
        f'[pipeline]\nextends = "{FIXED_TRAINING}"\n[[steps]]\npass = "planted.explode"\nafter = "joint"\n'
    )
    with pytest.raises(passkit.PassError):
        _train(tmp_path / "run.html", pipeline="planted.toml")
    page = (tmp_path / "run.html").read_text()
    assert '<tr class="failed"><td class="num">4</td><td>planted.explode</td>' in page
    assert "RuntimeError: planted failure" in page


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
def test_chromium_renders_the_report(tmp_path) -> None:
    browser = require_program("chromium", "chromium-browser", install="apt-get install chromium")
    report = tmp_path / "run.html"
    _train(report)
    shot = tmp_path / "shot.png"
    subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1280,2000",
         f"--screenshot={shot}", report.as_uri()],
        capture_output=True, timeout=120, check=True,
    )
    assert _png_size(shot) == (1280, 2000)
    # A blank page compresses to a few KiB; text, tables and two pictures do not.
    assert shot.stat().st_size > 50_000


@pytest.mark.slow
def test_tlparse_shows_passkit_steps_beside_dynamo_graphs(tmp_path) -> None:
    beside_python = Path(sys.executable).parent / "tlparse"
    tlparse = str(beside_python) if beside_python.exists() else require_program("tlparse", install="pip install tlparse")
    env = {**os.environ, "TORCH_TRACE": str(tmp_path / "trace"), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    run = subprocess.run(
        [sys.executable, "-m", "passkit", "run", FIXED_TRAINING, "--model", "planted_bugs:tiny"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stderr
    (log,) = (tmp_path / "trace").iterdir()
    subprocess.run([tlparse, str(log), "-o", str(tmp_path / "out"), "--no-browser"], capture_output=True, timeout=300, check=True)
    compile_dir = tmp_path / "out" / "-_0_0_0"
    names = sorted(re.sub(r"_\d+\.(txt|json)$", "", p.name) for p in compile_dir.iterdir())
    assert "dynamo_output_graph" in names
    assert names.index("passkit_00_captured_main") >= 0
    for artifact in ("passkit_01_functionalize_main", "passkit_03_joint_joint", "passkit_04_partition_default_forward",
                     "passkit_04_partition_default_record", "passkit_07_codegen_python_backward_generated"):
        assert artifact in names
    index = (tmp_path / "out" / "index.html").read_text()
    assert "passkit_03_joint_joint" in index
