"""example:gelu_tanh, tested with passkit's pytest plugin."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from passkit.testing import assert_pattern_matches
from passkit_example.gelu_tanh import gelu_tanh_set


def two_gelus(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x) + F.gelu(x * 2)


def test_exact_gelu_matches_once_per_call_and_computes_the_tanh_form() -> None:
    x = torch.randn(4, 6)
    # The rewrite changes numerics on purpose, so compare with the tanh form ourselves.
    applied, program = assert_pattern_matches(gelu_tanh_set(), two_gelus, x, times=2, numerics=False)
    assert dict(applied.counts) == {"gelu_tanh": 2}
    (out,) = program.graphs["main"](x)
    torch.testing.assert_close(out, F.gelu(x, approximate="tanh") + F.gelu(x * 2, approximate="tanh"))


def test_gelu_that_is_already_tanh_is_left_alone() -> None:
    with pytest.raises(pytest.fail.Exception, match="patterns applied 0 times"):
        assert_pattern_matches(gelu_tanh_set(), lambda x: F.gelu(x, approximate="tanh"), torch.randn(4, 6))


def test_float64_is_not_in_the_dtype_predicate() -> None:
    with pytest.raises(pytest.fail.Exception, match="patterns applied 0 times"):
        assert_pattern_matches(gelu_tanh_set(), F.gelu, torch.randn(4, 6, dtype=torch.float64))


@pytest.mark.parametrize("shape", [(5,), (2, 3, 5), (2, 3, 5, 7)], ids=["rank1", "rank3", "rank4"])
def test_one_pattern_traced_at_rank_2_matches_every_rank(shape: tuple[int, ...]) -> None:
    applied, _ = assert_pattern_matches(gelu_tanh_set(), F.gelu, torch.randn(*shape), times=1, numerics=False)
    assert dict(applied.counts) == {"gelu_tanh": 1}
