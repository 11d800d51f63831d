"""fx.dce and fx.cse: what they remove, and what they must never touch."""

from __future__ import annotations

import torch

from passkit.frontends.capture import program_from_function
from passkit.passes.fx_cleanup import cse, dce


def _targets(program) -> list[str]:
    return [str(n.target) for n in program.graphs["main"].graph.nodes if n.op == "call_function"]


def test_dce_removes_unused_values_but_keeps_mutations() -> None:
    def fn(x, buf):
        unused = x.cos()  # noqa: F841
        buf.add_(1)
        return x.sin()

    program = program_from_function(fn, [torch.randn(3), torch.zeros(3)])
    assert dce(program) is True
    assert _targets(program) == ["aten.add_.Tensor", "aten.sin.default"]


@torch.library.custom_op("passkit_test::require_finite", mutates_args=())
def _require_finite(x: torch.Tensor) -> None:
    if not torch.isfinite(x).all():
        raise ValueError("not finite")


@_require_finite.register_fake
def _(x: torch.Tensor) -> None:
    return None


def test_dce_keeps_a_call_that_returns_nothing_for_its_effect() -> None:
    # An op with no result runs only for its effect: an error check (linalg's
    # _linalg_check_errors, which torch 2.11 does not call effectful, so FX took it for dead).
    def fn(x):
        torch.ops.passkit_test.require_finite(x)
        return x.sin()

    program = program_from_function(fn, [torch.randn(3)])
    dce(program)
    assert _targets(program) == ["passkit_test.require_finite.default", "aten.sin.default"]


def test_cse_merges_identical_pure_ops_only() -> None:
    def fn(x):
        a, b = x.sin(), x.sin()
        r1, r2 = torch.rand(3), torch.rand(3)
        return a + b + r1 + r2

    program = program_from_function(fn, [torch.randn(3)])
    assert cse(program) is True
    targets = _targets(program)
    assert targets.count("aten.sin.default") == 1
    assert targets.count("aten.rand.default") == 2


def test_cse_does_not_merge_across_a_mutation() -> None:
    def fn(x, buf):
        before = buf.sum()
        buf.add_(1)
        after = buf.sum()
        return x * before * after

    program = program_from_function(fn, [torch.randn(3), torch.zeros(3)])
    cse(program)
    assert _targets(program).count("aten.sum.default") == 2
    buf = torch.zeros(3)
    x = torch.ones(3)
    torch.testing.assert_close(program.graphs["main"](x, buf)[0], x * 0.0 * 3.0)
