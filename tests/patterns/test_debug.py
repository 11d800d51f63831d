"""why_not and expect_match's nearest miss: where a pattern stopped matching, and which constraint failed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from functional_graphs import functional_main
import passkit
from passkit.patterns import Op, Pattern, PatternSet, Var, Where, from_trace
from passkit.patterns.debug import why_not
from passkit.testing import assert_pattern_matches


def exact(x):
    return F.gelu(x)


def test_a_differing_argument_is_named() -> None:
    pattern = from_trace(exact, [torch.empty(3, 5)], exact)
    gm = functional_main(lambda x: F.gelu(x, approximate="tanh") * 2, torch.randn(3, 5))
    assert why_not(gm, pattern) == [
        "exact at gelu: at depth 2: node gelu (aten.gelu.default) argument 1 (approximate): wanted 'none', found 'tanh'"
    ]


def test_a_missing_root_op_is_said_so() -> None:
    pattern = Pattern("nn", Op(torch.ops.aten.neg.default, Var("x")), build=lambda b, x: x)
    gm = functional_main(lambda x: x.exp(), torch.randn(3))
    assert why_not(gm, pattern) == ["nn: no node calls aten.neg.default, the pattern's root op"]


def test_assert_pattern_matches_fails_with_the_reasons() -> None:
    pattern = from_trace(exact, [torch.empty(3, 5)], exact)
    with pytest.raises(pytest.fail.Exception) as info:
        assert_pattern_matches(pattern, lambda x: F.gelu(x, approximate="tanh"), torch.randn(3, 5))
    assert str(info.value) == (
        "patterns applied 0 times, expected at least once; applied: {}; "
        "exact at gelu: at depth 2: node gelu (aten.gelu.default) argument 1 (approximate): wanted 'none', found 'tanh'"
    )


def tanh(x):
    return F.gelu(x, approximate="tanh")


def gelu_of_linear(x, w):
    return F.gelu(x @ w) * 2


def test_a_dtype_miss_names_the_dtype_not_the_node_found() -> None:
    pattern = from_trace(exact, [torch.empty(3, 5)], tanh, where={"x": Where(dtype=torch.float32)})
    gm = functional_main(gelu_of_linear, torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64))
    assert why_not(gm, pattern) == [
        "exact at gelu: at depth 2: node gelu (aten.gelu.default) argument 0 (self): "
        "x has dtype float64, the pattern wants float32"
    ]


@pytest.mark.parametrize(
    ("where", "reason"),
    [
        (Where(dtype=(torch.float32, torch.bfloat16)), "x has dtype float64, the pattern wants float32 or bfloat16"),
        (Where(rank=2), "x has rank 3, the pattern wants 2"),
        (Where(shape=(None, None, 4)), "x has shape [2, 3, 7], the pattern wants [None, None, 4]"),
        (Where(check=lambda val: val.shape[-1] == 4), "x is rejected by the pattern's where check"),
    ],
)
def test_each_failed_constraint_is_named(where: Where, reason: str) -> None:
    pattern = from_trace(exact, [torch.empty(3, 5)], tanh, where={"x": where})
    gm = functional_main(gelu_of_linear, torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64))
    assert why_not(gm, pattern) == [f"exact at gelu: at depth 2: node gelu (aten.gelu.default) argument 0 (self): {reason}"]


def test_expect_match_on_a_float64_model_says_the_dtype_differs(tmp_path, register_passkit_plugin) -> None:
    pattern = from_trace(exact, [torch.empty(3, 5)], tanh, where={"x": Where(dtype=torch.float32)})

    class Plugin:
        @passkit.hookimpl
        def passkit_register_patterns(self) -> dict:
            return {"acme:gelu_tanh": PatternSet("acme:gelu_tanh", (pattern,))}

    register_passkit_plugin(Plugin(), name="acme")
    path = tmp_path / "gelu.toml"
    path.write_text(
        '[pipeline]\nname = "gelu"\nextends = "training-python"\n\n[[steps]]\nid = "gelu_tanh"\npass = "rewrite"\n'
        'patterns = ["acme:gelu_tanh"]\nexpect_match = true\nafter = "decompose"\n'
    )
    compiled = passkit.aot_function(gelu_of_linear, pipeline=str(path), repro_dir="")
    with pytest.raises(passkit.PassError) as info:
        compiled(torch.randn(2, 3, 5, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64))
    assert str(info.value) == (
        f"{path}: steps[0] (gelu_tanh: rewrite) failed: PatternError: pattern 'acme:gelu_tanh' matched nothing; "
        "acme:gelu_tanh:exact: nearest node gelu: node gelu (aten.gelu.default) argument 0 (self): "
        "x has dtype float64, the pattern wants float32 (after: functionalize, decompose)"
    )
