"""from_trace: a traced search matches any rank unless its author pins one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from functional_graphs import functional_main
from passkit.patterns import Dim, Where, find_matches, from_trace
from passkit.patterns.debug import why_not


def exact(x):
    return F.gelu(x)


def last_softmax(x):
    return torch.softmax(x, -1)


def second_softmax(x):
    return torch.softmax(x, 1)


@pytest.mark.parametrize("shape", [(5,), (2, 3, 5), (2, 3, 5, 7)], ids=["rank1", "rank3", "rank4"])
def test_a_search_traced_at_rank_2_matches_every_rank(shape) -> None:
    pattern = from_trace(exact, [torch.empty(3, 5)], exact)
    gm = functional_main(lambda x: F.gelu(x) * 2, torch.randn(*shape))
    assert [m.roots[0].name for m in find_matches(gm, [pattern])] == ["gelu"]


def test_pinned_ranks_match_the_traced_rank_only_and_say_so() -> None:
    pattern = from_trace(exact, [torch.empty(3, 5)], exact, pin_ranks=True)
    assert len(find_matches(functional_main(F.gelu, torch.randn(4, 6)), [pattern])) == 1
    gm = functional_main(F.gelu, torch.randn(2, 3, 5))
    assert find_matches(gm, [pattern]) == []
    assert why_not(gm, pattern) == ["exact at gelu: at depth 2: node gelu (aten.gelu.default) fails Where(rank=2)"]


def test_a_where_pins_one_input_rank_and_dtype() -> None:
    pattern = from_trace(exact, [torch.empty(3, 5)], exact, where={"x": Where(rank=3, dtype=torch.float32)})
    assert len(find_matches(functional_main(F.gelu, torch.randn(2, 3, 5)), [pattern])) == 1
    assert find_matches(functional_main(F.gelu, torch.randn(3, 5)), [pattern]) == []
    assert find_matches(functional_main(F.gelu, torch.randn(2, 3, 5, dtype=torch.float64)), [pattern]) == []


def test_a_dim_counts_from_the_end_at_another_rank() -> None:
    last = from_trace(last_softmax, [torch.empty(3, 5)], last_softmax)
    second = from_trace(second_softmax, [torch.empty(3, 5)], second_softmax)
    (root,) = last.roots()
    assert root.args[1] == Dim(-1, rank=2)
    gm = functional_main(lambda x: torch.softmax(x, 2) + torch.softmax(x, 1) + torch.softmax(x, 0), torch.randn(2, 3, 5))
    matched = {pattern.name: [m.roots[0].args[1] for m in find_matches(gm, [pattern])] for pattern in (last, second)}
    # Traced at rank 2, dim 1 is the last dim: at rank 3 that is dim 2, never dim 0 or 1.
    assert matched == {"last_softmax": [2], "second_softmax": [2]}
