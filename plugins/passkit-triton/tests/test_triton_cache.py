"""codegen.triton and passkit's compile cache: a warm start rebuilds the launchers from the
entry, runs no stage, writes no kernel source, and (on a GPU) compiles no Triton kernel."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import passkit
from passkit_triton import codegen, launch
from triton_helpers import gpu, require_module

require_module("triton")
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def attention_scores(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x * 0.125 + w, dim=-1) * 2


def compile_and_run(x: torch.Tensor, w: torch.Tensor) -> tuple[object, torch.Tensor]:
    compiled = passkit.aot_function(attention_scores, pipeline="inference-triton")
    return compiled, compiled(x, w)


def cold_then_warm(device: str, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object, torch.Tensor]:
    x, w = torch.randn(8, 40, device=device), torch.randn(40, device=device)
    cold, expected = compile_and_run(x, w)
    # What a fresh process has: no kernel in memory. Writing kernel sources is compiling.
    monkeypatch.setattr(launch, "_KERNELS", {})
    monkeypatch.setattr(codegen, "kernel_spec", lambda *a, **k: pytest.fail("wrote a kernel on a warm start"))
    warm, actual = compile_and_run(x, w)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    torch.testing.assert_close(actual, attention_scores(x, w), rtol=1e-5, atol=1e-6)
    return cold, warm, actual


def test_a_warm_start_loads_the_compiled_program(device, monkeypatch) -> None:
    cold, warm, _ = cold_then_warm(device, monkeypatch)
    cold_report, warm_report = cold.passkit_reports[0], warm.passkit_reports[0]
    assert (cold_report.cache, warm_report.cache) == ("miss", "hit")
    (record,) = [r for r in warm_report.records if r.id == "codegen.triton"]
    assert record.stats == {"kernels": 1, "triton_kernels": 1, "aten_regions": 0}


@gpu
def test_a_warm_start_compiles_no_triton_kernel(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    written: dict[str, int] = {}

    def files() -> dict[str, int]:
        return {str(p): p.stat().st_mtime_ns for p in (tmp_path / "triton").rglob("*") if p.is_file()}

    x, w = torch.randn(8, 40, device="cuda"), torch.randn(40, device="cuda")
    # A kernel that an earlier test compiled in this process would be launched from memory.
    monkeypatch.setattr(launch, "_KERNELS", {})
    compile_and_run(x, w)
    torch.cuda.synchronize()
    written = files()
    assert any(name.endswith(".cubin") for name in written)
    monkeypatch.setattr(launch, "_KERNELS", {})  # a fresh process: Triton finds its binaries on disk
    warm, _ = compile_and_run(x, w)
    torch.cuda.synchronize()
    assert warm.passkit_reports[0].cache == "hit"
    assert files() == written  # nothing compiled, nothing rewritten
