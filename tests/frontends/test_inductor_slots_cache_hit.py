"""When Inductor's cache (its FX graph cache, or AOT Autograd's) answers a compile with a mounted
file, the slots' steps do not run in this process; ``passkit.reports()`` then holds one report
per such slot that says so, and the INFO log has one line for it, instead of nothing at all."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import passkit


def _train(options: dict) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 9), torch.nn.SiLU(), torch.nn.Linear(9, 2))
    torch.compile(model, options=options)(torch.randn(3, 7)).sum().backward()


@pytest.mark.slow
def test_an_inductor_cache_hit_leaves_a_report_and_a_line_that_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # cold, then warm
    options = passkit.inductor_options("inductor-post-grad")
    with torch._inductor.config.patch(fx_graph_cache=True):
        seen = len(passkit.reports())
        _train(options)
        cold = passkit.reports()[seen:]
        assert cold and all(report.cache == "" for report in cold)
        with caplog.at_level(logging.INFO, logger="passkit"):
            _train(options)
    torch._dynamo.reset()
    warm = passkit.reports()[seen + len(cold):]
    assert [(report.graph, report.cache) for report in warm] == [
        ("slot partition, Inductor cache hit (compile 0/0)", "inductor"),
        ("slot post_grad_pre, Inductor cache hit (compile 0/0)", "inductor"),
    ]
    reason = "Inductor's cache answered the compile: the steps ran in the process that compiled the entry"
    assert [(r.id, r.status, r.reason) for r in warm[1].records] == [("fx.cse", "skipped", reason), ("gemm", "skipped", reason)]
    lines = [record.getMessage() for record in caplog.records if record.name == "passkit" and "cache" in record.getMessage()]
    assert lines == [
        f"passkit: {report.graph}: Inductor's cache answered it; the slot's steps did not run in this process "
        "(their report is the compiling process's)"
        for report in warm
    ]
