"""The fixpoint driver: replacements, benefit order, refusals, counts and loud misses."""

from __future__ import annotations

import pytest
import torch

from passkit.frontends.capture import program_from_function
from passkit.passes.functionalize import functionalize
from passkit.patterns import (
    Op,
    Pattern,
    PatternError,
    PatternSet,
    Var,
    apply_patterns,
    expect_match,
    from_trace,
)

aten = torch.ops.aten


def _program(fn, *inputs, functional=True):
    program = program_from_function(fn, list(inputs))
    if functional:
        functionalize(program)
    return program


def _targets(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _run(program, *inputs):
    return program.graphs["main"](*inputs)


def _double_neg(x):
    return x.neg().neg()


def test_traced_search_and_traced_replacement_rewrite_the_graph_and_keep_numerics() -> None:
    def gelu_erf(x):
        return torch.nn.functional.gelu(x)

    def gelu_tanh(x):
        return torch.nn.functional.gelu(x, approximate="tanh")

    def fn(x):
        return torch.nn.functional.gelu(x * 2)

    pattern = from_trace(gelu_erf, [torch.empty(3, 5)], gelu_tanh)
    x = torch.randn(4, 6)
    program = _program(fn, x)
    applied = apply_patterns(program.graphs["main"], [pattern])
    assert dict(applied.counts) == {"gelu_erf": 1}
    assert [n.kwargs.get("approximate") for n in program.graphs["main"].graph.nodes if n.target is aten.gelu.default] == ["tanh"]
    torch.testing.assert_close(_run(program, x)[0], gelu_tanh(x * 2))


def test_graph_builder_replacement_gets_fake_values() -> None:
    def build(b, x):
        return b.call(aten.mul.Tensor, x, -1.0)

    pattern = Pattern("neg_to_mul", Op(aten.neg.default, Var("x")), build=build)
    program = _program(lambda x: x.neg() + 1, torch.randn(3))
    apply_patterns(program.graphs["main"], [pattern])
    node = next(n for n in program.graphs["main"].graph.nodes if n.target is aten.mul.Tensor)
    assert node.meta["val"].shape == (3,)
    x = torch.randn(3)
    torch.testing.assert_close(_run(program, x)[0], -x + 1)


def test_the_driver_reaches_a_fixpoint() -> None:
    pattern = from_trace(_double_neg, [torch.empty(3)], lambda x: x)
    program = _program(lambda x: x.neg().neg().neg().neg().neg().neg().exp(), torch.randn(3))
    applied = apply_patterns(program.graphs["main"], [pattern])
    assert applied.counts["_double_neg"] == 3
    assert _targets(program.graphs["main"]) == ["aten.exp.default"]


def test_higher_benefit_wins_a_contested_node() -> None:
    def build_abs(b, x):
        return b.call(aten.abs.default, x)

    def build_relu(b, x):
        return b.call(aten.relu.default, x)

    low = Pattern("low", Op(aten.neg.default, Op(aten.neg.default, Var("x"))), build=build_abs, benefit=1)
    high = Pattern("high", Op(aten.neg.default, Op(aten.neg.default, Var("x"))), build=build_relu, benefit=5)
    for order in ([low, high], [high, low]):
        program = _program(_double_neg, torch.randn(3))
        applied = apply_patterns(program.graphs["main"], order)
        assert dict(applied.counts) == {"high": 1}


def test_a_match_whose_intermediate_is_used_elsewhere_is_refused() -> None:
    def fn(x):
        inner = x.neg()
        return inner.neg(), inner * 3

    pattern = from_trace(_double_neg, [torch.empty(3)], lambda x: x)
    program = _program(fn, torch.randn(3))
    applied = apply_patterns(program.graphs["main"], [pattern])
    assert applied.total == 0
    assert dict(applied.refused) == {"_double_neg: intermediate used outside": 1}


def test_a_match_that_crosses_a_mutation_is_refused() -> None:
    def fn(x, buf):
        first = buf.neg()
        buf.add_(1)
        return first.neg() + x

    pattern = Pattern("nn", Op(aten.neg.default, Op(aten.neg.default, Var("x"))), build=lambda b, x: x)
    program = _program(fn, torch.randn(3), torch.zeros(3), functional=False)
    applied = apply_patterns(program.graphs["main"], [pattern])
    assert dict(applied.refused) == {"nn: crosses a mutation": 1}
    x, buf = torch.randn(3), torch.zeros(3)
    torch.testing.assert_close(_run(program, x, buf)[0], x)


def test_a_replacement_of_another_shape_is_refused_and_leaves_the_graph_alone() -> None:
    pattern = Pattern("sum_to_self", Op(aten.sum.default, Var("x")), build=lambda b, x: x)
    program = _program(lambda x: x.sum(), torch.randn(3))
    before = program.graphs["main"].code
    applied = apply_patterns(program.graphs["main"], [pattern])
    assert dict(applied.refused) == {"sum_to_self: replacement does not fit": 1}
    assert program.graphs["main"].code == before


def test_patterns_that_undo_each_other_fail_in_one_line() -> None:
    forth = Pattern("forth", Op(aten.neg.default, Var("x")), build=lambda b, x: b.call(aten.mul.Tensor, x, -1))
    back = Pattern("back", Op(aten.mul.Tensor, Var("x"), -1), build=lambda b, x: b.call(aten.neg.default, x))
    program = _program(lambda x: x.neg(), torch.randn(3))
    with pytest.raises(PatternError) as info:
        apply_patterns(program.graphs["main"], [forth, back], max_applications=20)
    assert str(info.value) == (
        "patterns did not reach a fixpoint after 20 rewrites (most applied: 'forth'); "
        "two patterns probably undo each other"
    )


def test_expect_match_names_the_pattern_that_matched_nothing() -> None:
    pattern = from_trace(_double_neg, [torch.empty(3)], lambda x: x)
    program = _program(lambda x: x.exp(), torch.randn(3))
    applied = apply_patterns(program.graphs["main"], PatternSet("s", (pattern,)).patterns)
    with pytest.raises(PatternError) as info:
        expect_match(applied, ["_double_neg"], where="my.toml: steps[2] (rewrite)")
    assert str(info.value) == "my.toml: steps[2] (rewrite): pattern '_double_neg' matched nothing"


def test_value_preserving_copies_are_looked_through() -> None:
    pattern = Pattern("nn", Op(aten.neg.default, Op(aten.neg.default, Var("x"))), build=lambda b, x: x)
    program = _program(lambda x: x.neg().clone().neg().exp(), torch.randn(3))
    assert apply_patterns(program.graphs["main"], [pattern]).total == 1
    assert _targets(program.graphs["main"]) == ["aten.exp.default"]


def test_a_wildcard_literal_pattern_never_binds_a_node_literal() -> None:
    pattern = Pattern("times_two", Op(aten.mul.Tensor, Var("x"), 2), build=lambda b, x: b.call(aten.add.Tensor, x, x))
    program = _program(lambda x, y: (x * 2, x * y, x * 3), torch.randn(3), torch.randn(3))
    assert apply_patterns(program.graphs["main"], [pattern]).total == 1
