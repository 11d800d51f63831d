"""conv_bn: eval BatchNorm folds into the convolution; results equal eager up to rounding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import passkit
from passkit.testing import assert_pattern_matches


def _model(bias: bool, affine: bool, dims: int = 2) -> nn.Module:
    torch.manual_seed(0)
    conv = (nn.Conv1d, nn.Conv2d)[dims - 1](3, 8, 3, bias=bias, groups=1)
    norm = (nn.BatchNorm1d, nn.BatchNorm2d)[dims - 1](8, affine=affine)
    with torch.no_grad():  # non-trivial running statistics
        norm.running_mean.uniform_(-1, 1)
        norm.running_var.uniform_(0.5, 2)
    return nn.Sequential(conv, norm, nn.ReLU()).eval()


@pytest.mark.parametrize(("bias", "affine", "dims"), [(True, True, 2), (False, True, 2), (True, False, 2), (False, True, 1)])
def test_conv_bn_folds_with_equal_numerics(bias: bool, affine: bool, dims: int) -> None:
    model = _model(bias, affine, dims)
    fn, tensors = _functional(model)
    x = torch.randn(2, 3, *([9] * dims))
    applied = assert_pattern_matches("conv_bn", fn, x, *tensors, times=1)
    assert dict(applied.counts) == {"conv_bn:fold": 1}


def _functional(model: nn.Module):
    params = dict(model.named_parameters()) | dict(model.named_buffers())

    def fn(x, *tensors):
        return torch.func.functional_call(model, dict(zip(params, tensors)), (x,))

    return fn, [t.clone() for t in params.values()]


def test_training_mode_batch_norm_is_not_folded() -> None:
    fn, tensors = _functional(_model(True, True).train())
    with pytest.raises(pytest.fail.Exception, match="patterns applied 0 times"):
        assert_pattern_matches("conv_bn", fn, torch.randn(2, 3, 9, 9), *tensors)


def test_inference_pipeline_folds_and_the_report_says_so(tmp_path) -> None:
    model = _model(True, True)
    path = tmp_path / "conv_bn.toml"
    path.write_text(
        '[pipeline]\nname = "conv_bn"\nextends = "inference-python"\n\n'
        '[[steps]]\npass = "rewrite"\npatterns = ["conv_bn"]\nexpect_match = true\nafter = "functionalize"\n'
    )
    compiled = passkit.aot_module(model, pipeline=str(path))
    x = torch.randn(2, 3, 9, 9)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    record = next(r for r in compiled.passkit_reports[0].records if r.id == "rewrite")
    assert record.stats["stage"] == "inference" and record.stats["applied"] == {"conv_bn:fold": 1}
