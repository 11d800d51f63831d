"""``codegen.inductor``'s ``region_calls``: a graph that calls outlined regions compiled as Python
calling each distinct body once (``python``, the default), or lowered whole by Inductor
(``inductor``); both exact to eager, the first with no code written per call."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import passkit
from passkit._torch.versions import TORCH_2_15
from passkit.examples import transformer
from tiny_programs import regions_overlay


def _pipeline(tmp_path: Path, region_calls: str | None = None) -> str:
    text = regions_overlay("training", "training-regions")
    if region_calls is not None:
        text += f'\n[override."codegen.inductor"]\nregion_calls = "{region_calls}"\n'
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    return str(path)


class Glued(nn.Module):
    """Blocks with a pointwise op between each two (``glue``; it shrinks gradients as it passes
    them, so twelve of them stay within float32 tolerances of eager), under a linear head."""

    def __init__(self, layers: int, glue: bool, dim: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(transformer.Block(dim, 4) for _ in range(layers))
        self.head = nn.Linear(dim, 8)
        self.glue = glue

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
            if self.glue:
                x = torch.tanh(x) * 0.1 + x * 0.9
        return self.head(x)


def _step_against_eager(model: nn.Module, pipeline: str) -> passkit.Report:
    eager = copy.deepcopy(model)
    x = torch.randn(2, 8, 32)
    compiled = passkit.compile(model, pipeline=pipeline, cache="off")
    out = compiled(x)
    (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum().backward()
    expected = eager(x)
    (expected * torch.linspace(0.5, 1.5, expected.numel()).reshape(expected.shape)).sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    return compiled.passkit_reports[0]


def _codegen_stats(report: passkit.Report) -> dict:
    return next(r for r in report.records if r.id == "codegen.inductor").stats


def test_a_stack_is_python_calling_one_compiled_body_per_graph(tmp_path: Path) -> None:
    torch.manual_seed(0)
    report = _step_against_eager(transformer.TransformerStack(4, 32, 4), _pipeline(tmp_path))
    stats = _codegen_stats(report)
    # The forward and the backward each call their own body, compiled once for the four calls.
    assert (stats["graphs_calling_bodies"], stats["bodies_compiled"], stats["runs_compiled"]) == (2, 2, 0)


def test_the_source_calls_the_body_once_a_layer(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = transformer.TransformerStack(3, 32, 4)
    compiled = passkit.compile(model, pipeline=_pipeline(tmp_path), cache="off", dump="changed",
                               dump_dir=str(tmp_path / "dump"))
    compiled(torch.randn(2, 8, 32)).sum().backward()
    forward = next((tmp_path / "dump").glob("*/*codegen.inductor-forward.py")).read_text()
    assert forward.count("= passkit__torch_region_calls_body_0(") == 3
    assert "# body_0" in forward and "# body_1" not in forward


@pytest.mark.parametrize("glue, layers, cut", [(False, 4, True), (True, 4, True), (True, 12, False)],
                         ids=["head-only", "glue-between-four", "glue-between-twelve"])
def test_ops_between_the_calls_are_compiled_run_by_run_up_to_a_limit(tmp_path: Path, glue: bool, layers: int,
                                                                       cut: bool) -> None:
    torch.manual_seed(0)
    stats = _codegen_stats(_step_against_eager(Glued(layers, glue), _pipeline(tmp_path)))
    if cut:
        assert stats["graphs_calling_bodies"] == 2
        assert 1 <= stats["runs_compiled"] <= 2 * _torch_limit()
    else:  # more runs than the limit: one Inductor graph each, as region_calls = "inductor"
        assert "graphs_calling_bodies" not in stats


def _torch_limit() -> int:
    from passkit import _torch

    return _torch.MAX_COMPILED_RUNS


def test_region_calls_inductor_lowers_each_graph_whole_and_is_exact_too(tmp_path: Path) -> None:
    torch.manual_seed(0)
    stats = _codegen_stats(_step_against_eager(transformer.TransformerStack(4, 32, 4), _pipeline(tmp_path, "inductor")))
    assert "graphs_calling_bodies" not in stats
    assert stats["cpp_kernels"] > 0


class ConvBlock(nn.Module):
    """Convolutions and ReLUs around a residual: the backward of each ReLU can take the memory of
    its saved output, which only the backward reads."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.first(x))
        y = torch.relu(self.second(y))
        y = torch.relu(self.first(y))
        return x + torch.relu(self.second(y))


def test_a_second_backward_of_a_kept_graph_reads_the_saved_values_a_call_wrote_into(tmp_path: Path) -> None:
    # Each backward call may write into the saved values it reads last (donation); a backward
    # that keeps its graph gets copies, so the second one reads them unchanged.
    torch.manual_seed(0)
    model = nn.Sequential(*(ConvBlock() for _ in range(3)))
    eager = copy.deepcopy(model)
    x = torch.randn(2, 8, 6, 6)
    compiled = passkit.compile(model, pipeline=_pipeline(tmp_path), cache="off", dump="changed",
                               dump_dir=str(tmp_path / "dump"))
    loss = compiled(x).square().sum()
    loss.backward(retain_graph=True)
    loss.backward()
    expected = eager(x).square().sum()
    expected.backward(retain_graph=True)
    expected.backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert _codegen_stats(compiled.passkit_reports[0])["graphs_calling_bodies"] == 2
    body = next((tmp_path / "dump").glob("*/*codegen.inductor-backward.py")).read_text().split("# body_0")[1]
    # The body's backward takes its saved activations as donated: Inductor may write into them.
    assert re.search(r"^\s+primals_\w+, .*\w_donated\b.* = args$", body, re.MULTILINE), body[:2000]
    if not TORCH_2_15:
        # torch 2.11-2.14's Inductor does write into one here; 2.15's scheduler reuses its own
        # buffers in this body instead (the copies above are then never written, and still right).
        assert "_donated; del " in body  # ``buf5 = relu_2_donated; del relu_2_donated  # reuse``
