"""The ``regions`` pass at depth: the work on an outlined body does not grow with its repeats."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import passkit
from passkit.examples import transformer
from tiny_programs import REGIONS_PYTHON

OVERLAY = REGIONS_PYTHON

# Every run of the op on fake tensors: Dynamo's trace, and each time a stage runs a body.
FAKE_RUNS: list[int] = []


@torch.library.custom_op("passkit_regions_depth::double", mutates_args=())
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_double.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    FAKE_RUNS.append(1)
    return torch.empty_like(x)


def _double_backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001 - torch's signature
    return grad * 2


_double.register_autograd(_double_backward)


class CountedBlock(nn.Module):
    """The acceptance block, with an op that counts its runs on fake tensors."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.block = transformer.Block(dim, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(torch.ops.passkit_regions_depth.double(x) * 0.5)


class Stack(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(CountedBlock() for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _fake_runs(layers: int, tmp_path: Path) -> tuple[int, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = Stack(layers)
    x = torch.randn(2, 8, 32)
    path = tmp_path / "regions.toml"
    path.write_text(OVERLAY)
    torch._dynamo.reset()
    FAKE_RUNS.clear()
    compiled = passkit.compile(model, pipeline=str(path), cache="off")
    out = compiled(x)
    out.sum().backward()
    runs = len(FAKE_RUNS)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert compiled.passkit_reports[0].records[0].stats["regions"] == 1
    return runs, out, grads


@pytest.mark.slow
def test_each_extra_repeat_of_a_region_runs_once_on_fake_tensors_while_compiling(tmp_path: Path) -> None:
    # Dynamo traces every layer once; the stages after `regions` run the one shared body a fixed
    # number of times, however many layers call it (each call ran it again before).
    three, _, _ = _fake_runs(3, tmp_path)
    six, out, grads = _fake_runs(6, tmp_path)
    assert six - three == 3

    torch.manual_seed(0)
    eager = Stack(6)
    expected = eager(torch.randn(2, 8, 32))
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grads, torch.cat([p.grad.flatten() for p in eager.parameters()]))


INDUCTOR_TABLE = OVERLAY + """
[override.decompose]
tables = ["inductor"]
"""


@pytest.mark.slow
def test_decompose_keeps_region_calls_whose_bodies_have_nothing_to_lower(tmp_path: Path) -> None:
    # Inductor's table lowers nothing in the block: the graph of region calls is kept as it is,
    # as the same layers inline are, rather than traced again.
    torch.manual_seed(0)
    model = transformer.TransformerStack(6, 32, 4)
    x = torch.randn(2, 8, 32)
    path = tmp_path / "regions.toml"
    path.write_text(INDUCTOR_TABLE)
    compiled = passkit.compile(model, pipeline=str(path), cache="off")
    out = compiled(x)
    records = {r.id: r for r in compiled.passkit_reports[0].records}
    assert records["regions"].stats["regions"] == 1
    assert (records["decompose"].changed, records["decompose"].nodes_before, records["decompose"].nodes_after) == (
        False, records["functionalize"].nodes_after, records["functionalize"].nodes_after
    )
    torch.testing.assert_close(out, model(x))
