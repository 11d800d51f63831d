"""Programs torch's own AOT path trains and passkit refuses in one line, each shown both ways.

For each: eager's result, ``backend="aot_eager"`` matching it, and passkit's exact one-line
refusal on ``training`` and ``training-python`` through ``torch.compile``, so a silent wrong
gradient can never pass for a refusal and a fix shows up as this test failing.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import passkit

PIPELINES = ["training", "training-python"]

HIDDEN_WRITE_ERROR = (
    "passkit: node mul_ writes in place to a tensor that requires grad where autograd does not record it "
    "(under no_grad or through .detach()), and the program then uses that tensor with autograd; eager's "
    "gradients for this cannot be reproduced from a functional graph: move the write out of the compiled "
    'function, or use on_error = "eager"'
)

SUBCLASS_GRAD_ERROR = (
    "passkit: the gradient of plain input 'l_w_' is a TwoTensor, which a compiled program cannot return; "
    "make 'l_w_' a TwoTensor too, or compile without it"
)


def _hidden_writes_mixed_with_tracked(a: torch.Tensor) -> torch.Tensor:
    a.detach().mul_(2)
    a.mul_(3)
    with torch.no_grad():
        a.mul_(4)
    return a + 5


def _hidden_write(fn: Callable[..., Any]) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    leaf = torch.randn(4, requires_grad=True)
    out = fn(leaf.add(1))
    out.sum().backward()
    assert leaf.grad is not None
    return out.detach(), leaf.grad


def _two_tensor_times_plain_weight(x: TwoTensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sum()


def _subclass_grad(fn: Callable[..., Any]) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = TwoTensor(torch.randn(3), torch.randn(3))
    w = torch.randn(3, requires_grad=True)
    fn(x, w).backward()
    assert isinstance(w.grad, TwoTensor)
    return w.grad.a, w.grad.b


CASES: dict[str, tuple[Callable[..., Any], Callable[[Callable[..., Any]], Any], str, str]] = {
    # name: (program, run it and return what eager observes, the step that refuses, its line)
    "in_place_under_no_grad_and_detach_mixed_with_tracked": (
        _hidden_writes_mixed_with_tracked, _hidden_write, "functionalize", HIDDEN_WRITE_ERROR,
    ),
    "plain_parameter_with_a_subclass_gradient": (
        _two_tensor_times_plain_weight, _subclass_grad, "", SUBCLASS_GRAD_ERROR,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_aot_eager_matches_eager(case: str) -> None:
    fn, run, _, _ = CASES[case]
    torch._dynamo.reset()
    torch.testing.assert_close(run(torch.compile(fn, backend="aot_eager")), run(fn))


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("case", CASES)
def test_passkit_refuses_in_one_line(case: str, pipeline: str) -> None:
    fn, run, step, line = CASES[case]
    torch._dynamo.reset()
    with pytest.raises(passkit.PasskitError) as info:
        run(torch.compile(fn, backend=passkit.backend(pipeline)))
    message = str(info.value)
    if step:
        # A step's failure names the pipeline file and the step around the pass's own line.
        assert f"({step}) failed: PasskitError: " in message
        own = message.split(" failed: PasskitError: ")[1]
        assert own.split(" (first step)")[0].split(" (after: ")[0] == line
    else:
        assert message == line
