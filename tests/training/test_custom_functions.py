"""Custom ``torch.autograd.Function``s inside a compiled training program, through Dynamo.

Dynamo records such a Function as one ``autograd_function_apply`` op. passkit's forward-only
traces inlined its forward and ``joint`` differentiated that, a silent wrong gradient wherever
the Function's backward is not its forward's derivative (a forward returning its input, whose
backward scales; a backward that writes in place). torch's own AOT path keeps the backward
(``aot_eager`` matches eager, checked here); passkit refuses with the one line its ``make_fx``
path already gives, and ``on_error = "eager"`` runs the Function with its own backward.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import passkit

PIPELINES = ["training-python", "training"]


class _ReturnsItsInput(torch.autograd.Function):
    # The output aliases the input; the backward is no derivative of the forward.
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 3


class _BackwardWritesInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        out = grad.clone()
        out.mul_(x)
        return out


def _returns_its_input(x: torch.Tensor) -> torch.Tensor:
    return _ReturnsItsInput.apply(x) * 2


def _backward_writes_in_place(x: torch.Tensor) -> torch.Tensor:
    return _BackwardWritesInPlace.apply(x).sin()


PROGRAMS = {
    "forward_returns_its_input": (_returns_its_input, "_ReturnsItsInput"),
    "backward_writes_in_place": (_backward_writes_in_place, "_BackwardWritesInPlace"),
}


def _gradient(fn: Callable[..., Any]) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(4, requires_grad=True)
    fn(x.add(1)).sum().backward()
    assert x.grad is not None
    return x.grad


@pytest.mark.parametrize("program", PROGRAMS)
def test_torchs_own_aot_path_keeps_the_functions_backward(program: str) -> None:
    fn, _ = PROGRAMS[program]
    torch._dynamo.reset()
    torch.testing.assert_close(_gradient(torch.compile(fn, backend="aot_eager", fullgraph=True)), _gradient(fn))


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("program", PROGRAMS)
def test_custom_function_in_a_dynamo_graph_is_refused_not_differentiated(program: str, pipeline: str) -> None:
    fn, name = PROGRAMS[program]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=passkit.backend(pipeline))
    with pytest.raises(passkit.PasskitError) as info:
        _gradient(compiled)
    assert str(info.value) == (
        f"passkit: the program calls the custom torch.autograd.Function '{name}', whose own backward "
        'passkit cannot keep; call it outside the compiled function, or use on_error = "eager"'
    )


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("program", PROGRAMS)
def test_custom_function_falls_back_to_eager_with_its_own_backward(program: str, pipeline: str) -> None:
    fn, _ = PROGRAMS[program]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=passkit.backend(pipeline, on_error="eager"))
    with pytest.warns(RuntimeWarning):
        grad = _gradient(compiled)
    torch.testing.assert_close(grad, _gradient(fn))


@pytest.mark.parametrize("program", PROGRAMS)
def test_custom_function_on_the_make_fx_path_is_refused(program: str) -> None:
    fn, name = PROGRAMS[program]
    with pytest.raises(passkit.PasskitError, match=f"custom torch.autograd.Function '{name}'"):
        _gradient(passkit.aot_function(fn, pipeline="training-python"))


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_custom_function_in_an_inference_graph_still_compiles(pipeline: str) -> None:
    # Without gradients the forward is all that runs, so inlining it is exact.
    torch._dynamo.reset()
    backend = passkit.backend(pipeline)
    x = torch.randn(4)
    torch.testing.assert_close(torch.compile(_returns_its_input, backend=backend)(x), x * 2)
    assert backend.reports
