"""The numerics comparator holds each value to the precision its dtype carries: a bfloat16 or
TF32 result is not a mismatch for differing in a bit that fp32 settings would judge."""

from __future__ import annotations

import torch

from passkit import _torch
from passkit.compare import compare_values, dtype_tolerance


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
