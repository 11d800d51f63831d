"""why_not: one line per candidate node saying where a pattern stopped matching."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from functional_graphs import functional_main
from passkit.patterns import Op, Pattern, Var, from_trace
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
