"""The attention set: explicit attention forms become scaled_dot_product_attention, numerics stay."""

from __future__ import annotations

import math

import pytest
import torch

import passkit
from passkit.examples import transformer
from passkit.testing import assert_pattern_matches

B, H, S, E = 2, 4, 8, 16


def _qkv(requires_grad: bool = False) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(B, H, S, E, requires_grad=requires_grad) for _ in range(3)]


def scaled_mul(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) * (1 / math.sqrt(E)), dim=-1) @ v


def scaled_div_with_float_mask(q, k, v, mask):
    return ((q @ k.transpose(-1, -2)) / math.sqrt(E) + mask).softmax(-1) @ v


def causal_triu_masked_fill(q, k, v):
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
    scores = (q @ k.transpose(2, 3)) * 0.25
    return scores.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v


def tensor_scale_no_mask(q, k, v):
    return (q @ k.transpose(-1, -2) / torch.full([], 4.0)).softmax(-1) @ v


def unscaled(q, k, v):
    return (q @ k.transpose(-1, -2)).softmax(-1) @ v


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (scaled_mul, "attention:mul_none"),
        (causal_triu_masked_fill, "attention:mul_masked_fill"),
        (tensor_scale_no_mask, "attention:div_tensor_none"),
        (unscaled, "attention:none_none"),
    ],
)
def test_explicit_forms_match_and_keep_numerics(fn, name) -> None:
    applied = assert_pattern_matches("attention", fn, *_qkv(), times=1)
    assert dict(applied.counts) == {name: 1}


def test_additive_float_mask_is_passed_on() -> None:
    mask = torch.zeros(B, 1, S, S).masked_fill(torch.rand(B, 1, S, S) > 0.7, -1e9)
    applied = assert_pattern_matches("attention", scaled_div_with_float_mask, *_qkv(), mask, times=1)
    assert dict(applied.counts) == {"attention:div_add": 1}


def test_patterns_match_after_core_aten_lowering_too() -> None:
    applied = assert_pattern_matches("attention", causal_triu_masked_fill, *_qkv(), passes=("functionalize", "decompose"))
    assert dict(applied.counts) == {"attention:mul_masked_fill": 1}


def test_a_mask_computed_from_inputs_is_left_alone() -> None:
    """A bool mask that is not a graph constant may mask whole rows: eager gives NaN there."""

    def input_mask(q, k, v, keep):
        return (q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf")).softmax(-1) @ v

    keep = torch.rand(S, S) > 0.5
    with pytest.raises(pytest.fail.Exception, match="patterns applied 0 times"):
        assert_pattern_matches("attention", input_mask, *_qkv(), keep)


def test_softmax_over_another_dim_is_not_attention() -> None:
    def wrong_dim(q, k, v):
        return (q @ k.transpose(-1, -2)).softmax(-2) @ v

    with pytest.raises(pytest.fail.Exception, match="patterns applied 0 times"):
        assert_pattern_matches("attention", wrong_dim, *_qkv())


def _pipeline(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[pipeline]\nname = "{name}"\nextends = "training-python"\n\n{body}')
    return str(path)


def _saved_bytes(compiled) -> int:
    for report in compiled.passkit_reports:
        for record in report.records:
            if record.pass_name.startswith("partition"):
                return record.stats["saved_bytes"]
    raise AssertionError("no partition step ran")


def test_block_trains_through_sdpa_with_eager_numerics_and_saves_less(tmp_path) -> None:
    model, (x,) = transformer.block()
    twin = __import__("copy").deepcopy(model)
    # training-python ships the attention step; here it must match, and facts are verified.
    checked = _pipeline(tmp_path, "checked", '[settings]\nverify = "facts"\n\n[override.attention]\nexpect_match = true\n')
    compiled = passkit.aot_module(twin, pipeline=checked)
    out, expected = compiled(x), model(x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    (out**2).mean().backward()
    (expected**2).mean().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    rewrite = next(r for r in compiled.passkit_reports[0].records if r.id == "attention")
    assert rewrite.stats["stage"] == "pre-grad"
    assert rewrite.stats["applied"] == {"attention:div_masked_fill": 1}
    without = _pipeline(tmp_path, "without", 'disable = ["attention"]\n')
    plain = passkit.aot_module(__import__("copy").deepcopy(model), pipeline=without)
    plain(x)
    assert _saved_bytes(compiled) < _saved_bytes(plain)
