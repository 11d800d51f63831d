"""Custom ``torch.autograd.Function``s inside a compiled training program keep their own backward.

Dynamo records such a Function as one ``autograd_function_apply`` op; ``aot_function`` traces
through it. passkit's forward-only traces inline its forward, and differentiating that is a
silent wrong gradient wherever the Function's backward is not its forward's derivative (a
forward returning its input, whose backward scales; a backward that writes in place). So
capture keeps the graph as captured (or the user's function) and ``joint`` differentiates it
with autograd, which runs the Function's own backward, as torch's AOT path does (``aot_eager``
matches eager, checked here). Such a program is not cached, and the report says why.
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


class _BackwardWritesIntoItsGradient(torch.autograd.Function):
    # Found by ``passkit fuzz``: the joint trace saw the tangent written and refused the program.
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.mul_(2)


def _returns_its_input(x: torch.Tensor) -> torch.Tensor:
    return _ReturnsItsInput.apply(x) * 2


def _backward_writes_in_place(x: torch.Tensor) -> torch.Tensor:
    return _BackwardWritesInPlace.apply(x).sin()


def _backward_writes_into_its_gradient(x: torch.Tensor) -> torch.Tensor:
    return _BackwardWritesIntoItsGradient.apply(x).sin()


PROGRAMS = {
    "forward_returns_its_input": _returns_its_input,
    "backward_writes_in_place": _backward_writes_in_place,
    "backward_writes_into_its_gradient": _backward_writes_into_its_gradient,
}


def _gradient(fn: Callable[..., Any]) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(4, requires_grad=True)
    out = fn(x.add(1))
    out.sum().backward()
    assert x.grad is not None
    return out.detach(), x.grad


@pytest.mark.parametrize("program", PROGRAMS)
def test_torchs_own_aot_path_keeps_the_functions_backward(program: str) -> None:
    fn = PROGRAMS[program]
    torch._dynamo.reset()
    torch.testing.assert_close(_gradient(torch.compile(fn, backend="aot_eager", fullgraph=True)), _gradient(fn))


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("program", PROGRAMS)
def test_custom_function_in_a_dynamo_graph_trains_as_eager(program: str, pipeline: str) -> None:
    fn = PROGRAMS[program]
    torch._dynamo.reset()
    backend = passkit.backend(pipeline, cache="on")
    torch.testing.assert_close(_gradient(torch.compile(fn, backend=backend, fullgraph=True)), _gradient(fn))
    (report,) = backend.reports
    assert report.uncached.startswith("its joint is differentiated from the captured graph")
    (joint,) = [record for record in report.records if record.pass_name == "joint"]
    assert joint.stats["differentiated"] == "the captured graph (a custom autograd.Function)"


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("program", PROGRAMS)
def test_custom_function_through_aot_function_trains_as_eager(program: str, pipeline: str) -> None:
    fn = PROGRAMS[program]
    torch.testing.assert_close(_gradient(passkit.aot_function(fn, pipeline=pipeline)), _gradient(fn))


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_custom_function_in_an_inference_graph_compiles(pipeline: str) -> None:
    # Without gradients the forward is all that runs, so inlining it is exact.
    torch._dynamo.reset()
    backend = passkit.backend(pipeline)
    x = torch.randn(4)
    torch.testing.assert_close(torch.compile(_returns_its_input, backend=backend)(x), x * 2)
    assert backend.reports


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_step_keeps_eagers_numerics(program: str) -> None:
    fn = PROGRAMS[program]
    torch._dynamo.reset()
    backend = passkit.backend("training-python", verify="numerics")
    torch.testing.assert_close(_gradient(torch.compile(fn, backend=backend, dynamic=True)), _gradient(fn))
