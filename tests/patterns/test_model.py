"""Patterns are plain data: equal patterns are equal and hash alike; fingerprints are stable."""

from __future__ import annotations

from pathlib import Path

import subprocess
import sys

import pytest
import torch

from passkit.patterns import ANY, Alt, Op, Pattern, PatternSet, Var, Where, from_trace

aten = torch.ops.aten


def _keep(builder, x):
    return x


def test_equal_patterns_are_equal_hash_alike_and_share_a_fingerprint() -> None:
    a = Pattern("double_neg", Op(aten.neg.default, Op(aten.neg.default, Var("x"))), build=_keep)
    b = Pattern("double_neg", Op(aten.neg.default, Op(aten.neg.default, Var("x"))), build=_keep)
    assert a == b and hash(a) == hash(b) and a.fingerprint() == b.fingerprint()
    assert len({a, b}) == 1
    other = Pattern("double_neg", Op(aten.neg.default, Var("x")), build=_keep)
    assert other.fingerprint() != a.fingerprint()


def test_list_arguments_are_frozen_so_patterns_stay_hashable() -> None:
    pattern = Op(aten.permute.default, Var("x"), [1, 0])
    assert pattern.args[1] == (1, 0)
    hash(pattern)


def test_sets_compose_with_plus() -> None:
    one = Pattern("one", Op(aten.neg.default, Var("x")), build=_keep)
    two = Pattern("two", Op(aten.abs.default, Var("x"), where=Where(rank=2)), build=_keep)
    both = PatternSet("a", (one,)) + PatternSet("b", (two,))
    assert both.name == "a+b" and both.patterns == (one, two)
    hash(both)


def test_a_pattern_needs_exactly_one_replacement() -> None:
    try:
        Pattern("broken", Op(aten.neg.default, ANY))
    except ValueError as exc:
        assert str(exc) == "pattern 'broken': give exactly one of replace= or build="
    else:
        raise AssertionError("no error")


def _search(x):
    return x.neg().neg()


def test_traced_pattern_fingerprint_is_the_same_in_another_process() -> None:
    code = (
        f"import torch, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r});"
        "from test_model import traced; print(traced().fingerprint())"
    )
    here = traced().fingerprint()
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert there.returncode == 0, there.stderr[-2000:]
    assert here == there.stdout.strip()


def traced() -> Pattern:
    return from_trace(_search, [torch.empty(2, 3)], build=_keep, where={"x": Where(dtype=torch.float32)})


def test_alternatives_are_data_too() -> None:
    assert Alt(1, 2) == Alt(1, 2) and Alt(1, 2) != Alt(2, 1)


def test_two_patterns_of_one_name_in_a_set_are_an_error() -> None:
    one = Pattern("neg", Op(aten.neg.default, Var("x")), build=_keep)
    with pytest.raises(ValueError) as info:
        PatternSet("acme:negs", (one, one))
    assert str(info.value) == "pattern set 'acme:negs' has two patterns named 'neg'"


def test_one_rule_for_several_overloads_is_one_pattern_with_alternatives() -> None:
    from passkit.patterns.sets.noops import noops_set

    names = [p.name for p in noops_set().patterns]
    assert names == ["view", "unsafe_view", "reshape", "expand", "alias", "mul_one", "div_one", "sub_zero", "add_zero"]
    (mul_one,) = [p for p in noops_set().patterns if p.name == "mul_one"]
    assert [o.target for o in mul_one.search.options] == [aten.mul.Tensor, aten.mul.Scalar]


def test_a_where_shows_only_what_it_asks() -> None:
    assert repr(Where(rank=2)) == "Where(rank=2)"
    assert repr(Where(dtype=(torch.float32,), shape=(None, "k"))) == "Where(dtype=(torch.float32,), shape=(None, 'k'))"
