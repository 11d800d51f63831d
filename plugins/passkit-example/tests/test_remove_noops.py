"""example.remove_noops: what it removes, what it must keep, its options and its pipeline file.

Programs come from passkit's pytest plugin (``make_program``), and every rewrite is checked with
``assert_pass_preserves_numerics``, which compares outputs (and gradients) with the capture.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import passkit
from passkit.testing import assert_pass_preserves_numerics
from passkit_example import remove_noops


def targets(program, graph: str = "main") -> list[str]:
    """The ops a graph calls, in order, as ``aten.mul.Tensor``-style names."""
    return [str(n.target) for n in program.graphs[graph].graph.nodes if n.op == "call_function"]


def noisy(x: torch.Tensor) -> torch.Tensor:
    y = (x * 1).view(4, 3)          # mul by one, then a view to the same shape
    y = (y / 1 - 0).reshape(4, 3)   # div by one, sub zero, same-shape reshape (a view once functional)
    return y.sin() + 1


def test_removes_each_noop_and_keeps_numerics(make_program) -> None:
    program = make_program(noisy, torch.randn(4, 3))
    assert targets(program) == [
        "aten.mul.Tensor", "aten.view.default", "aten.div.Tensor", "aten.sub.Tensor",
        "aten.view.default", "aten.sin.default", "aten.add.Tensor",
    ]

    changed = assert_pass_preserves_numerics(remove_noops, program)

    assert changed is True
    assert targets(program) == ["aten.sin.default", "aten.add.Tensor"]
    assert program.stats == {"rewrites": 5}


def test_finds_the_pass_by_its_registered_name(make_program) -> None:
    program = make_program(noisy, torch.randn(4, 3))
    assert assert_pass_preserves_numerics("example.remove_noops", program) is True
    assert program.stats == {"rewrites": 5}


def test_training_graph_keeps_gradients(make_program) -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ((x * 1) @ w).view(4, 2).tanh() / 1

    program = make_program(fn, torch.randn(4, 3), torch.randn(3, 2, requires_grad=True), passes=("functionalize", "joint"))
    assert program.training

    assert assert_pass_preserves_numerics(remove_noops, program) is True
    assert "aten.mul.Tensor" not in targets(program, "joint")
    assert program.stats["rewrites"] >= 2


def test_keeps_ops_whose_result_the_graph_returns(make_program) -> None:
    # Returning x itself would make the output alias the input, unlike eager's fresh tensor.
    program = make_program(lambda x: (x * 1, x.view(3)), torch.randn(3))

    assert assert_pass_preserves_numerics(remove_noops, program) is False
    assert targets(program) == ["aten.mul.Tensor", "aten.view.default"]
    assert program.stats == {"rewrites": 0}


@pytest.mark.parametrize(
    ("fn", "example", "kept"),
    [
        # -0.0 + 0 is +0.0, so float x + 0 is not the identity ...
        (lambda x: (x + 0).exp(), torch.tensor([-0.0, 1.0]), "aten.add.Tensor"),
        # ... and x - (-0.0) is x + 0.
        (lambda x: (x - (-0.0)).exp(), torch.tensor([-0.0, 1.0]), "aten.sub.Tensor"),
        # bool * 1 promotes to int64; int / 1 is true division to float.
        (lambda x: (x * 1).sum(), torch.tensor([True, False]), "aten.mul.Tensor"),
        (lambda x: (x / 1).sum(), torch.tensor([1, 2]), "aten.div.Tensor"),
        # floor(x / 1) is not x.
        (lambda x: torch.div(x, 1, rounding_mode="floor").exp(), torch.tensor([0.5]), "aten.div.Tensor_mode"),
        # (a + bj) * 1 computes b * 0, which is NaN for an infinite b.
        (lambda x: (x * 1).abs(), torch.tensor([1 + 1j]), "aten.mul.Tensor"),
        # a view to another shape is not a no-op.
        (lambda x: x.view(3, 4).exp(), torch.randn(4, 3), "aten.view.default"),
        # detach stops gradients before the joint graph exists.
        (lambda x: x.detach().exp(), torch.randn(3), "aten.detach.default"),
    ],
    ids=["float-add-zero", "float-sub-negative-zero", "bool-mul", "int-div", "floor-div", "complex-mul", "reshaping-view", "detach"],
)
def test_keeps_ops_that_are_not_exact_identities(make_program, fn, example, kept) -> None:
    program = make_program(fn, example)
    assert kept in targets(program)

    assert_pass_preserves_numerics(remove_noops, program)

    assert kept in targets(program)
    assert program.stats == {"rewrites": 0}


def test_removes_exact_zero_additions(make_program) -> None:
    program = make_program(lambda x, n: ((x + (-0.0)).exp(), (n + 0) * 2), torch.tensor([-0.0, 1.0]), torch.tensor([1, 2]))

    assert assert_pass_preserves_numerics(remove_noops, program) is True
    assert targets(program) == ["aten.exp.default", "aten.mul.Tensor"]


def test_ops_option_limits_what_is_removed(make_program) -> None:
    program = make_program(noisy, torch.randn(4, 3))

    assert_pass_preserves_numerics(remove_noops, program, ops=["aten.mul", "aten.div"])

    assert targets(program) == ["aten.view.default", "aten.sub.Tensor", "aten.view.default", "aten.sin.default", "aten.add.Tensor"]
    assert program.stats == {"rewrites": 2}


def test_max_rewrites_caps_the_rewrites(make_program) -> None:
    program = make_program(noisy, torch.randn(4, 3))

    assert_pass_preserves_numerics(remove_noops, program, max_rewrites=1)

    assert targets(program)[0] == "aten.view.default"
    assert program.stats == {"rewrites": 1}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('ops = ["aten.mull"]', "ops: unknown op 'aten.mull'; did you mean 'aten.mul'?"),
        (
            'ops = ["aten.detach"]',
            "ops: unknown op 'aten.detach'; choose from aten.view, aten._unsafe_view, aten.reshape, "
            "aten.expand, aten.alias, aten.mul, aten.div, aten.sub, aten.add",
        ),
        ("max_rewrites = -1", "max_rewrites: Input should be greater than or equal to 0"),
    ],
)
def test_bad_options_fail_when_the_file_loads(tmp_path: Path, monkeypatch, override: str, message: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.toml").write_text(
        f'[pipeline]\nextends = "training-noops"\n\n[override."example.remove_noops"]\n{override}\n'
    )
    with pytest.raises(passkit.PipelineError) as raised:
        passkit.load_pipeline("bad.toml")
    assert str(raised.value) == f'bad.toml: override."example.remove_noops".{message}'


def test_shipped_pipeline_inserts_the_pass_after_joint() -> None:
    pipeline = passkit.load_pipeline("training-noops")
    ids = [step.id for step in pipeline.steps]
    assert ids[ids.index("joint") + 1] == "example.remove_noops"
    assert ids[0] == "functionalize" and ids[-1] == "codegen.python"
    assert pipeline.description == "The training pipeline plus example.remove_noops after joint"


def test_pipeline_compiles_and_matches_eager() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ((x * 1).view(4, 3) @ w).reshape(4, 2).relu().sum()

    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=True)
    compiled = passkit.aot_function(fn, pipeline="training-noops")
    out = compiled(x, w)
    out.backward()
    w_eager = w.detach().clone().requires_grad_()
    expected = fn(x, w_eager)
    expected.backward()

    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(w.grad, w_eager.grad)
    (record,) = [r for r in compiled.passkit_reports[0].records if r.id == "example.remove_noops"]
    assert record.status == "ran" and record.changed
    assert record.stats["rewrites"] > 0
