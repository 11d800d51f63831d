"""The numerics comparator holds each value to the precision its dtype carries: a bfloat16 or
TF32 result is not a mismatch for differing in a bit that fp32 settings would judge."""

from __future__ import annotations

import torch

from passkit import _torch
from passkit.verify.compare import compare_values, dtype_tolerance


def test_bfloat16_values_one_rounding_apart_match_where_float32_ones_do_not() -> None:
    expected = torch.tensor([1.0, 2.0, 3.0])
    actual = expected * (1 + 2**-8)  # one bfloat16 ulp at 1.0
    assert compare_values([expected.bfloat16()], [actual.bfloat16()], "out").ok
    comparison = compare_values([expected], [actual], "out")
    assert [str(m) for m in comparison.mismatches] == ["out[0]: max |diff| 0.0117"]


def test_settings_looser_than_the_dtype_floor_still_win() -> None:
    expected = torch.tensor([1.0]).bfloat16()
    actual = torch.tensor([1.5]).bfloat16()
    assert not compare_values([expected], [actual], "out").ok
    assert compare_values([expected], [actual], "out", (0.5, 1e-5)).ok


def test_float32_on_a_gpu_with_tf32_is_held_to_half_precision() -> None:
    with _torch.new_fake_mode():
        on_gpu = torch.empty(3, device="cuda")
    matmul = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        with torch.backends.cudnn.flags(allow_tf32=True):
            assert dtype_tolerance(on_gpu) == (5e-3, 1e-4)  # cuDNN's convolutions use TF32 by default
        with torch.backends.cudnn.flags(allow_tf32=False):
            assert dtype_tolerance(on_gpu) == (0.0, 0.0)
        torch.backends.cuda.matmul.allow_tf32 = True
        with torch.backends.cudnn.flags(allow_tf32=False):
            assert dtype_tolerance(on_gpu) == (5e-3, 1e-4)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
    assert dtype_tolerance(torch.empty(3)) == (0.0, 0.0)


def test_the_tolerance_is_the_loosest_declared_by_the_steps_each_for_its_options() -> None:
    import types

    from passkit.verify.compare import Tolerance, tolerance_for
    from passkit.core.pass_api import graph_pass

    def declared(options) -> tuple[float, float] | None:
        return (1e-2, 1e-6) if options.approximate else None

    @graph_pass("t.maybe_approximate", tolerance=declared)
    def maybe(program, *, approximate: bool = False) -> bool:
        return False

    @graph_pass("t.fixed", tolerance=(1e-3, 1e-3))
    def fixed(program) -> bool:
        return False

    settings = types.SimpleNamespace(rtol=1e-4, atol=1e-5)

    def step(pass_, **options):
        return types.SimpleNamespace(pass_=pass_, options=pass_.options(**options))

    assert tolerance_for(settings, [step(maybe)]) == Tolerance(1e-4, 1e-5)
    assert tolerance_for(settings, [step(maybe, approximate=True)]) == Tolerance(1e-2, 1e-5)
    # rtol and atol loosen each on its own: the loosest of each.
    both = tolerance_for(settings, [step(maybe, approximate=True), step(fixed)])
    assert (both, str(both)) == (Tolerance(1e-2, 1e-3), "rtol 0.01, atol 0.001")
    assert str(tolerance_for(types.SimpleNamespace(rtol=0.5, atol=0.25), [step(fixed)])) == "rtol 0.5, atol 0.25"


def test_a_rewrite_step_declares_the_loosest_tolerance_of_its_pattern_sets() -> None:
    import planted_gelu
    from passkit.core.plugins import make_plugin_manager
    from passkit.core.registry import build_registry

    pm = make_plugin_manager(load_entry_points=False)
    pm.register(planted_gelu, name="planted_gelu")
    registry = build_registry(pm)
    rewrite = registry.get_pass("rewrite")
    assert rewrite.declared_tolerance(rewrite.options(registry=registry, patterns=["noops"])) is None
    options = rewrite.options(registry=registry, patterns=["noops", "planted_gelu"])
    assert rewrite.declared_tolerance(options) == (5e-2, 1e-2)


def test_a_pattern_set_refuses_a_tolerance_that_is_not_rtol_atol() -> None:
    import pytest

    from passkit.patterns import PatternSet

    with pytest.raises(ValueError) as info:
        PatternSet("bad", (), tolerance=(1e-3,))
    assert str(info.value) == "pattern set 'bad': tolerance must be (rtol, atol), both >= 0, not (0.001,)"
    assert (PatternSet("a", (), tolerance=(1e-3, 0)) + PatternSet("b", (), tolerance=(0, 1e-2))).tolerance == (1e-3, 1e-2)


def test_the_pytest_plugin_holds_a_pass_to_its_declared_tolerance(make_program) -> None:
    import pytest

    import planted_gelu
    from passkit.testing import assert_pass_preserves_numerics

    torch.manual_seed(0)
    x = torch.randn(64) * 4
    assert assert_pass_preserves_numerics(planted_gelu.gelu_tanh_loose, make_program(torch.nn.functional.gelu, x)) is True
    with pytest.raises(pytest.fail.Exception) as info:
        assert_pass_preserves_numerics(planted_gelu.gelu_tanh, make_program(torch.nn.functional.gelu, x))
    assert str(info.value).startswith("pass planted.gelu_tanh changed numerics: max |diff| ")
    assert str(info.value).endswith(" in output[0] of graph main (rtol 0.001, atol 0.0001)")
