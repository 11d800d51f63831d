"""codegen.triton's numerics where Triton's defaults differ from torch: NaN, tanh, CPU scalars.

Kernels run in Triton's interpreter without a GPU; the interpreter keeps Triton's NaN rules
(``tl.maximum`` drops a NaN unless told to propagate it), so these tests show on the CPU what a
GPU would compute.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from triton_helpers import assert_close, gpu, launchers, require_module

require_module("triton")
pytestmark = [
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

NAN_CASES = {
    "relu": lambda x, y: (x * 2).relu(),
    "clamp": lambda x, y: (x * 2).clamp(-1.0, 1.0),
    "clamp_min": lambda x, y: (x * 2).clamp_min(0.5),
    "maximum": lambda x, y: torch.maximum(x * 2, y),
    "minimum": lambda x, y: torch.minimum(x * 2, y),
    "amax": lambda x, y: (x * 2).amax(-1, keepdim=True),
    "amin": lambda x, y: (x * 2).amin(-1, keepdim=True),
    "softmax": lambda x, y: torch.softmax(x * 2, -1),
}


def with_nans(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x, y = torch.randn(6, 40, device=device), torch.randn(6, 40, device=device)
    x[1, 3] = x[4, 39] = float("nan")  # an AMP overflow, say; row 4's NaN is its last column
    y[2, 0] = float("nan")
    return x, y


@pytest.mark.parametrize("max_row", [16384, 16], ids=["whole_row", "looped"])
@pytest.mark.parametrize("name", list(NAN_CASES))
def test_nan_inputs_give_nan_as_in_eager(triton_compile, device, name, max_row) -> None:
    fn = NAN_CASES[name]
    x, y = with_nans(device)
    program = triton_compile(fn, x, y, max_row=max_row)

    (launcher,) = launchers(program)
    actual = program.compiled["main"](x, y)[0]
    torch.testing.assert_close(actual, fn(x, y), rtol=1e-5, atol=1e-5, equal_nan=True)
    assert launcher.fallbacks == 0
    # The rule, in the source: every max and min either propagates NaN or is NaN where its row
    # holds one.
    source = next(iter(launcher.plans.values())).spec.source
    reductions = re.findall(r"tl\.(?:max|min)\(", source)
    guarded = re.findall(r'tl\.where\(tl\.sum\(tl\.where\((\w+) != \1, 1, 0\), axis=1, keep_dims=True\) > 0, float\("nan"\), tl\.(?:max|min)\(\1,', source)
    assert len(guarded) == len(reductions)
    calls = re.findall(r"tl\.(?:maximum|minimum)\([^\n]*", source)
    assert all("propagate_nan=tl.PropagateNan.ALL" in call for call in calls)
    assert calls or reductions


def test_tanh_is_accurate_near_zero(triton_compile, device) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * 1.0)

    tiny = [1e-8, -3e-7, 1e-5, -2e-4, 1e-3, 0.1, -0.3, 0.6, 0.7, -1.5, 5.0, 20.0, -50.0, 0.0, float("nan")]
    x = torch.cat([torch.tensor(tiny), torch.randn(200) * 3, torch.randn(200) * 1e-3]).to(device)
    program = triton_compile(fn, x)

    actual = program.compiled["main"](x)[0]
    # A few float32 ulps everywhere, relative: 2*sigmoid(2x) - 1 gave 0 for 1e-8.
    torch.testing.assert_close(actual, torch.tanh(x), rtol=4e-7, atol=0, equal_nan=True)
    assert launchers(program)[0].fallbacks == 0


def scaled(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (x * s + 1).relu()


def test_a_cpu_scalar_tensor_is_passed_by_value(triton_compile, device) -> None:
    x, s = torch.randn(8, 16, device=device), torch.tensor(0.5)
    program = triton_compile(scaled, x, s)
    (launcher,) = launchers(program)

    assert launcher.spec.scalars == (1,)
    assert "x1_scalar = (tl.zeros([1, 1], tl.float32) + in1)" in launcher.spec.source
    for value in (0.5, -2.0):
        assert_close(program.compiled["main"](x, torch.tensor(value))[0], scaled(x, torch.tensor(value)))
    assert (launcher.calls, launcher.fallbacks) == (2, 0)


def test_a_cuda_region_that_reads_a_cpu_scalar_is_planned_as_a_kernel(triton_compile) -> None:
    # What a GPU would be handed, from fake CUDA tensors: a plan on the GPU, not the ATen ops.
    program = triton_compile(scaled, torch.randn(8, 16), torch.tensor(0.5))
    (launcher,) = launchers(program)
    with FakeTensorMode():
        x, s = torch.empty(8, 16, device="cuda"), torch.empty((), device="cpu")
        plan = launcher.plan(x, s)
    assert plan is not None and plan.device == torch.device("cuda", 0)
    assert plan.spec.scalars == (1,)
    assert len(plan.sizes) == 2 + 1 + 2  # M, N, one leading size, x's two strides; none for s


@gpu
def test_a_cpu_scalar_with_cuda_tensors_runs_the_kernel(triton_compile) -> None:
    x, s = torch.randn(8, 16, device="cuda"), torch.tensor(0.5)
    program = triton_compile(scaled, x, s)
    assert_close(program.compiled["main"](x, s)[0], scaled(x, s))
    assert launchers(program)[0].fallbacks == 0
