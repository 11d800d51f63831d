"""The matcher: bindings, wildcards, predicates on meta["val"], commutativity, multi-output."""

from __future__ import annotations

import pytest
import torch

from functional_graphs import functional_main
from passkit.patterns import ANY, Dim, Op, Pattern, Var, Where, find_matches

aten = torch.ops.aten


def _keep(builder, **bindings):
    return bindings["x"]


def test_named_bindings_must_agree() -> None:
    same = Pattern("same", Op(aten.mul.Tensor, Var("x"), Var("x")), build=_keep)
    gm = functional_main(lambda a, b: (a * a, a * b), torch.randn(3), torch.randn(3))
    matches = find_matches(gm, [same])
    assert len(matches) == 1
    assert matches[0].bindings["x"].name == "arg0_1"


def test_overload_packets_match_every_overload() -> None:
    packet = Pattern("mul", Op(aten.mul, Var("x"), ANY), build=_keep)
    exact = Pattern("mul", Op(aten.mul.Scalar, Var("x"), ANY), build=_keep)
    gm = functional_main(lambda a, b: (a * b, a * 2), torch.randn(3), torch.randn(3))
    assert len(find_matches(gm, [packet])) == 2
    assert len(find_matches(gm, [exact])) == 0  # tracing writes mul.Tensor for `a * 2`


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (Where(dtype=torch.float32), 1),
        (Where(dtype=(torch.float16, torch.bfloat16)), 0),
        (Where(rank=2), 1),
        (Where(rank=3), 0),
        (Where(shape=("n", "n")), 0),
        (Where(shape=(4, None)), 1),
        (Where(check=lambda val: val.numel() == 20), 1),
    ],
)
def test_predicates_on_meta_val(where: Where, expected: int) -> None:
    pattern = Pattern("relu", Op(aten.relu.default, Var("x", where=where)), build=_keep)
    gm = functional_main(lambda a: a.relu(), torch.randn(4, 5))
    assert len(find_matches(gm, [pattern])) == expected


def test_symbolic_sizes_must_agree_across_bindings() -> None:
    square = Pattern(
        "mm",
        Op(aten.mm.default, Var("x", Where(shape=("m", "k"))), Var("w", Where(shape=("k", "k")))),
        build=_keep,
    )
    gm = functional_main(lambda a, b, c: (a @ b, a @ c), torch.randn(2, 3), torch.randn(3, 3), torch.randn(3, 4))
    matches = find_matches(gm, [square])
    assert [m.bindings["w"].name for m in matches] == ["arg1_1"]


def test_commutative_matching_only_where_asked() -> None:
    def fn(a, b):
        return b.exp() + a, a + b.exp()

    plain = Pattern("p", Op(aten.add.Tensor, Var("x"), Op(aten.exp.default, ANY)), build=_keep)
    either = Pattern("p", Op(aten.add.Tensor, Var("x"), Op(aten.exp.default, ANY), commutative=True), build=_keep)
    gm = functional_main(fn, torch.randn(3), torch.randn(3))
    assert len(find_matches(gm, [plain])) == 1
    assert len(find_matches(gm, [either])) == 2


def test_dims_match_modulo_rank_and_literals_exactly() -> None:
    softmax_last = Pattern("s", Op(aten._softmax.default, Var("x"), Dim(-1), False), build=_keep)
    gm = functional_main(lambda a: (a.softmax(2), a.softmax(-1), a.softmax(1)), torch.randn(2, 3, 4))
    assert len(find_matches(gm, [softmax_last])) == 2


def test_multi_output_patterns_share_bindings() -> None:
    pair = Pattern(
        "pair",
        (Op(aten.mm.default, Var("x"), Var("w1")), Op(aten.mm.default, Var("x"), Var("w2"))),
        build=lambda b, x, w1, w2: (x, x),
    )
    gm = functional_main(lambda x, y, a, b: (x @ a, x @ b, y @ a), torch.randn(2, 3), torch.randn(2, 3), torch.randn(3, 3), torch.randn(3, 3))
    matches = find_matches(gm, [pair])
    assert {tuple(sorted(n.name for n in m.roots)) for m in matches} == {("mm", "mm_1")}
    assert all(m.bindings["x"].name == "arg0_1" for m in matches)


def test_wildcards_bind_nothing() -> None:
    pattern = Pattern("any", Op(aten.add.Tensor, ANY, ANY), build=lambda b: None)
    gm = functional_main(lambda a, b: a + b, torch.randn(3), torch.randn(3))
    assert find_matches(gm, [pattern])[0].bindings == {}
