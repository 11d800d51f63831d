"""constant_fold: uniform constant tensors in elementwise ops become scalars, exactly."""

from __future__ import annotations

import pytest
import torch

from passkit.testing import assert_pattern_matches


def _targets(program) -> list[str]:
    return [str(n.target) for n in program.graphs["main"].graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (lambda x: x / torch.full([], 8.0), "constant_fold:div_uniform"),
        (lambda x: torch.full((4, 5), 0.1) * x, "constant_fold:mul_uniform"),
        (lambda x: x + torch.ones(5) * 3, "constant_fold:add_uniform"),
        (lambda x: x - torch.full([], 2.5), "constant_fold:sub_uniform"),
    ],
    ids=["div-0d", "mul-full-shape", "add-derived", "sub"],
)
def test_uniform_constants_become_scalars_with_identical_results(fn, name) -> None:
    applied, program = assert_pattern_matches("constant_fold", fn, torch.randn(4, 5), times=1, numerics=False)
    assert name in applied.counts
    x = torch.randn(4, 5)
    (out,) = program.graphs["main"](x)
    assert torch.equal(out, fn(x))  # bit for bit, not just close


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x * torch.arange(5.0),                  # not uniform
        lambda x: x * torch.full((3, 4, 5), 2.0),         # broadcasts x up: another shape
        lambda x, y: x * y,                              # not a constant
        lambda x: x * torch.full([], float("nan")),     # NaN is left alone
        lambda x: torch.add(torch.ones(()), x, alpha=2),  # 1 + 2x is not x + 2
    ],
    ids=["arange", "broadcasts-up", "input", "nan", "add-alpha-swapped"],
)
def test_other_operands_are_left_alone(fn) -> None:
    inputs = [torch.randn(4, 5)] * (fn.__code__.co_argcount)
    with pytest.raises(pytest.fail.Exception, match="patterns applied 0 times"):
        assert_pattern_matches("constant_fold", fn, *inputs)
