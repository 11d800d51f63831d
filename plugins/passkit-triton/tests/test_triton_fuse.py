"""fuse.regions: which ops form regions, its options, and that regions keep numerics.

Regions run as their FX submodules here (no Triton needed): ``assert_pass_preserves_numerics``
runs the fused graphs and compares them with the capture.
"""

from __future__ import annotations

import operator

import pytest
import torch
from triton_helpers import pipeline_options

import passkit
from passkit.testing import assert_pass_preserves_numerics
from passkit_triton import fuse_regions
from passkit_triton.fuse import check_fused


def regions(program, graph: str = "main") -> list[dict]:
    return [n.meta["fusion_region"] for n in program.graphs[graph].graph.nodes if n.op == "call_module"]


def outside(program, graph: str = "main") -> list[str]:
    """The ops left outside regions."""
    return [
        str(n.target)
        for n in program.graphs[graph].graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem
    ]


@pytest.fixture
def decomposed(make_program):
    """A functional program lowered as the shipped ``training-triton`` or ``inference-triton``
    pipeline lowers it."""

    def build(fn, *inputs, passes=("functionalize",)):
        program = make_program(fn, *inputs, passes=passes)
        pipeline = "training-triton" if program.training else "inference-triton"
        assert_pass_preserves_numerics("decompose", program, **pipeline_options(pipeline, "decompose"))
        return program

    return build


def attention_tail(x: torch.Tensor, mask: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax((x / 4).masked_fill(mask, float("-inf")), dim=-1) @ v


def test_softmax_with_its_prologue_is_one_region(decomposed) -> None:
    program = decomposed(attention_tail, torch.randn(2, 8, 8), torch.rand(8, 8) > 0.7, torch.randn(2, 8, 4))

    assert assert_pass_preserves_numerics(fuse_regions, program) is True

    (region,) = regions(program)
    assert region == {
        "kind": "reduction",
        "size": 7,
        "domain": ["2", "8", "8"],
        "ops": ["aten.amax.default", "aten.div.Tensor", "aten.exp.default", "aten.sub.Tensor", "aten.sum.dim_IntList", "aten.where.self"],
    }
    assert outside(program) == ["aten.scalar_tensor.default", "aten.expand.default", "aten.view.default", "aten.expand.default", "aten.view.default", "aten.bmm.default", "aten.view.default"]
    assert program.stats == {"regions": 1, "fused_ops": 7}


def test_layer_norm_and_gelu_fuse_and_the_matmul_between_them_stays(decomposed) -> None:
    norm, linear = torch.nn.LayerNorm(16), torch.nn.Linear(16, 32)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(linear(norm(x)))

    program = decomposed(fn, torch.randn(3, 5, 16))
    assert_pass_preserves_numerics(fuse_regions, program)

    first, second = regions(program)
    assert first["kind"] == "reduction" and "aten.var_mean.correction" in first["ops"]
    assert second["kind"] == "pointwise" and second["ops"] == ["aten.add.Tensor", "aten.erf.default", "aten.mul.Tensor"]
    assert "aten.addmm.default" in outside(program)


def test_training_graphs_fuse_after_partition(decomposed) -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x @ w, dim=-1).sum()

    program = decomposed(
        fn, torch.randn(4, 6), torch.randn(6, 5, requires_grad=True), passes=("functionalize",)
    )
    for name in ("joint", "partition.default"):
        assert_pass_preserves_numerics(name, program)

    assert assert_pass_preserves_numerics(fuse_regions, program) is True
    assert [r["kind"] for r in regions(program, "forward")] == ["reduction"]
    # The backward is log_softmax's own formula (joint lowers it after autograd, exact to eager).
    # Its row sum reads the broadcast tangent straight from an `expand`, which regions leave to
    # ATen with the data movement; every pointwise op is in a region.
    assert {r["kind"] for r in regions(program, "backward")} == {"pointwise"}
    assert set(outside(program, "backward")) == {
        "aten.alias.default", "aten.expand.default", "aten.permute.default", "aten.mm.default", "aten.sum.dim_IntList",
    }
    assert "fused" in program.facts


def test_a_joint_graph_is_refused(make_program) -> None:
    program = make_program(lambda x: x.exp().sum(), torch.randn(3, requires_grad=True), passes=("functionalize", "joint"))
    with pytest.raises(passkit.PassError) as raised:
        fuse_regions(program)
    assert str(raised.value) == "fuse.regions: runs after partition.* or on an inference program (found the 'joint' graph)"


def test_a_region_never_depends_on_itself(decomposed) -> None:
    # b = exp(a) feeds a matmul whose result comes back into a pointwise op of a's region.
    def fn(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        b = (a * 2).exp()
        return (b @ w) + b.sin()

    program = decomposed(fn, torch.randn(4, 4), torch.randn(4, 4))
    assert assert_pass_preserves_numerics(fuse_regions, program) is True
    program.graphs["main"].graph.lint()
    # sin joins exp's region; the add would close a loop through the matmul, so it stays out.
    assert [r["ops"] for r in regions(program)] == [["aten.exp.default", "aten.mul.Tensor", "aten.sin.default"]]
    assert outside(program)[-1] == "aten.add.Tensor"


def test_families_option_limits_what_fuses(decomposed) -> None:
    program = decomposed(attention_tail, torch.randn(2, 8, 8), torch.rand(8, 8) > 0.7, torch.randn(2, 8, 4))

    assert_pass_preserves_numerics(fuse_regions, program, families=["arithmetic", "transcendental", "comparison"])

    assert [r["ops"] for r in regions(program)] == [["aten.div.Tensor", "aten.where.self"], ["aten.exp.default", "aten.sub.Tensor"]]
    assert outside(program).count("aten.amax.default") == 1


def test_reductions_can_be_kept_apart_from_their_producers(decomposed) -> None:
    program = decomposed(lambda x: (x * 3).sum(-1, keepdim=True) + 1, torch.randn(5, 7))

    assert_pass_preserves_numerics(fuse_regions, program, reduce_with_producers=False, min_size=1)

    assert [r["ops"] for r in regions(program)] == [["aten.mul.Tensor"], ["aten.add.Tensor", "aten.sum.dim_IntList"]]


def test_max_size_and_min_size(decomposed) -> None:
    program = decomposed(lambda x: x.exp().sin().cos().neg().abs(), torch.randn(5))

    assert_pass_preserves_numerics(fuse_regions, program, max_size=2, min_size=2)

    assert [r["size"] for r in regions(program)] == [2, 2]
    assert outside(program) == ["aten.abs.default"]


def test_reductions_over_other_dimensions_stay_aten(decomposed) -> None:
    program = decomposed(lambda x: (x.exp().sum(0) * 2, x.sum(-1).exp() * 2), torch.randn(5, 7))

    assert_pass_preserves_numerics(fuse_regions, program)

    assert "aten.sum.dim_IntList" in outside(program)
    assert [r["ops"] for r in regions(program)] == [["aten.exp.default", "aten.mul.Tensor", "aten.sum.dim_IntList"]]


def test_bad_families_fail_when_the_file_loads(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.toml").write_text('[pipeline]\nextends = "training-triton"\n\n[override."fuse.regions"]\nfamilies = ["pointwise"]\n')
    with pytest.raises(passkit.PipelineError) as raised:
        passkit.load_pipeline("bad.toml")
    assert str(raised.value) == (
        "bad.toml: override.\"fuse.regions\".families[0]: Input should be 'arithmetic', 'transcendental', 'comparison', 'cast' or 'reduction'"
    )


def test_the_fused_fact_checker_names_a_region_holding_an_op_that_may_not_fuse(decomposed) -> None:
    program = decomposed(lambda x: (x * 2).exp() + 1, torch.randn(4, 4))
    fuse_regions(program)
    assert check_fused(program) is None

    (call,) = [n for n in program.graphs["main"].graph.nodes if n.op == "call_module"]
    sub = program.graphs["main"].get_submodule(call.target)
    (exp,) = [n for n in sub.graph.nodes if n.target is torch.ops.aten.exp.default]
    exp.target = torch.ops.aten.cumsum.default  # as if a buggy pass had rewritten it
    assert check_fused(program) == f"main:{call.name} holds aten.cumsum.default, which may not fuse"
