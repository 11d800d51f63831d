"""The noops set (formerly the example plugin's remove_noops pass): what it removes, what it keeps.

Every rewrite runs through the ``rewrite`` pass with ``assert_pass_preserves_numerics``, which
compares outputs (and gradients) with the capture.
"""

from __future__ import annotations

import pytest
import torch

from passkit.testing import assert_pass_preserves_numerics


def targets(program, graph: str = "main") -> list[str]:
    return [str(n.target) for n in program.graphs[graph].graph.nodes if n.op == "call_function"]


def noisy(x: torch.Tensor) -> torch.Tensor:
    y = (x * 1).view(4, 3)          # mul by one, then a view to the same shape
    y = (y / 1 - 0).reshape(4, 3)   # div by one, sub zero, same-shape reshape (a view once functional)
    return y.sin() + 1


def test_removes_each_noop_and_keeps_numerics(make_program) -> None:
    program = make_program(noisy, torch.randn(4, 3))
    assert assert_pass_preserves_numerics("rewrite", program, patterns=["noops"]) is True
    assert targets(program) == ["aten.sin.default", "aten.add.Tensor"]
    assert program.stats["applied"] == {"noops:div_one": 1, "noops:mul_one": 1, "noops:sub_zero": 1, "noops:view": 2}


def test_both_overloads_of_one_rule_count_under_its_one_name(make_program) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return (torch.ops.aten.mul.Scalar(x, 1) * 1).sin()

    program = make_program(fn, torch.randn(4, 3))
    assert {"aten.mul.Scalar", "aten.mul.Tensor"} <= set(targets(program))
    assert assert_pass_preserves_numerics("rewrite", program, patterns=["noops"]) is True
    assert targets(program) == ["aten.sin.default"]
    assert program.stats["applied"] == {"noops:mul_one": 2}


def test_training_graph_keeps_gradients(make_program) -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ((x * 1) @ w).view(4, 2).tanh() / 1

    program = make_program(fn, torch.randn(4, 3), torch.randn(3, 2, requires_grad=True), passes=("functionalize", "joint"))
    assert assert_pass_preserves_numerics("rewrite", program, patterns=["noops"]) is True
    assert "aten.mul.Tensor" not in targets(program, "joint")
    assert program.stats["stage"] == "joint"


def test_keeps_ops_whose_result_the_graph_returns(make_program) -> None:
    # Returning x itself would make the output alias the input, unlike eager's fresh tensor.
    program = make_program(lambda x: (x * 1, x.view(3)), torch.randn(3))
    assert assert_pass_preserves_numerics("rewrite", program, patterns=["noops"]) is False
    assert targets(program) == ["aten.mul.Tensor", "aten.view.default"]


@pytest.mark.parametrize(
    ("fn", "example", "kept"),
    [
        (lambda x: (x + 0).exp(), torch.tensor([-0.0, 1.0]), "aten.add.Tensor"),
        (lambda x: (x - (-0.0)).exp(), torch.tensor([-0.0, 1.0]), "aten.sub.Tensor"),
        (lambda x: (x * 1).sum(), torch.tensor([True, False]), "aten.mul.Tensor"),
        (lambda x: (x / 1).sum(), torch.tensor([1, 2]), "aten.div.Tensor"),
        (lambda x: torch.div(x, 1, rounding_mode="floor").exp(), torch.tensor([0.5]), "aten.div.Tensor_mode"),
        (lambda x: (x * 1).abs(), torch.tensor([1 + 1j]), "aten.mul.Tensor"),
        (lambda x: x.view(3, 4).exp(), torch.randn(4, 3), "aten.view.default"),
        (lambda x: x.detach().exp(), torch.randn(3), "aten.detach.default"),
    ],
    ids=["float-add-zero", "float-sub-negative-zero", "bool-mul", "int-div", "floor-div", "complex-mul", "reshaping-view", "detach"],
)
def test_keeps_ops_that_are_not_exact_identities(make_program, fn, example, kept) -> None:
    program = make_program(fn, example)
    assert kept in targets(program)
    assert_pass_preserves_numerics("rewrite", program, patterns=["noops"])
    assert kept in targets(program)
    assert program.stats["rewrites"] == 0


def test_removes_exact_zero_additions(make_program) -> None:
    program = make_program(lambda x, n: ((x + (-0.0)).exp(), (n + 0) * 2), torch.tensor([-0.0, 1.0]), torch.tensor([1, 2]))
    assert assert_pass_preserves_numerics("rewrite", program, patterns=["noops"]) is True
    assert targets(program) == ["aten.exp.default", "aten.mul.Tensor"]
