"""``tools/gpu-check``, the one command for a GPU machine: without CUDA it says so in one line
and exits 2, writing nothing; every Python file it runs imports here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
GPU_CHECK = ROOT / "tools" / "gpu-check"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path) -> None:
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(GPU_CHECK), str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == "gpu-check: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU machine\n"
    assert not out.exists()


def test_an_unknown_part_is_one_line(tmp_path) -> None:
    result = subprocess.run([sys.executable, str(GPU_CHECK), str(tmp_path), "--parts", "speed"], capture_output=True,
                            text=True, timeout=300)
    assert (result.returncode, result.stderr) == (
        2, "gpu-check: unknown part 'speed'; choose from correctness, regions, cudagraphs, tests, triton, step_time\n")


@pytest.mark.parametrize("path", ["tools/gpu-check", "benchmarks/step_time.py", "benchmarks/triton_gpu.py"])
def test_every_file_it_runs_imports(path: str, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "models"))
    loader = SourceFileLoader(f"gpu_check_{Path(path).stem.replace('-', '_')}", str(ROOT / path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    monkeypatch.setitem(sys.modules, loader.name, module)  # dataclasses look their module up
    loader.exec_module(module)
    assert callable(module.main)


def _gpu_check_module(monkeypatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "models"))
    loader = SourceFileLoader("gpu_check_tool", str(GPU_CHECK))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    monkeypatch.setitem(sys.modules, loader.name, module)
    loader.exec_module(module)
    return module


def test_a_conv_bn_step_matches_on_the_cpu(tmp_path) -> None:
    # Its first conv's bias gradient is zero by algebra (batch norm follows): rounding noise in
    # eager and in passkit alike, which a check against eager alone called a mismatch.
    result = subprocess.run([sys.executable, str(GPU_CHECK), str(tmp_path), "--device", "cpu", "--parts", "correctness",
                             "--models", "conv_bn"], capture_output=True, text=True, timeout=600)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (result.returncode, [(r["model"], r["dtype"], r["ok"]) for r in summary["parts"]["correctness"]["rows"]]) == (
        0, [("conv_bn", "float32", True), ("conv_bn", "bfloat16", True)]), result.stdout[-2000:]


def test_a_gradient_five_percent_off_is_a_mismatch(monkeypatch) -> None:
    check = _gpu_check_module(monkeypatch)
    torch.manual_seed(0)
    truth = {"output": torch.randn(100, dtype=torch.float64), "grad:w": torch.randn(50, dtype=torch.float64)}
    eager = {name: value.bfloat16() for name, value in truth.items()}
    off = {**eager, "grad:w": (truth["grad:w"] * 1.05).bfloat16()}
    assert check._differences(eager, eager, "bfloat16", truth) == []
    (against_float64,) = check._differences(eager, off, "bfloat16", truth)
    assert against_float64.startswith("grad:w: error against float64 ")
    (against_eager,) = check._differences(eager, off, "bfloat16")
    assert against_eager.startswith("grad:w: norm-wise error ")


def test_a_row_that_raised_leaves_its_innermost_traceback_in_the_log(monkeypatch, tmp_path) -> None:
    check = _gpu_check_module(monkeypatch)
    log = check.Log(tmp_path / "gpu-check.log")

    def lowering() -> None:
        raise AttributeError("'NoneType' object has no attribute 'target'")

    try:
        try:
            lowering()
        except AttributeError as inner:
            raise RuntimeError("Inductor cannot compile the 'backward' graph") from inner
    except RuntimeError as outer:
        check._log_root_cause(outer, log)
    lines = (tmp_path / "gpu-check.log").read_text().splitlines()
    assert lines[0] == "    | Traceback (most recent call last):"
    assert any("in lowering" in line for line in lines)
    assert lines[-1] == "    | AttributeError: 'NoneType' object has no attribute 'target'"
