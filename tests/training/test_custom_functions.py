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
    # The output aliases the input; the backward is no derivative of the forward (torch's
    # test_input_output_aliase_custom_autograd_function).
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 0.5


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


# -- a Function's result that shares its input's memory, returned as the compiled output ------------
#
# The runtime makes an output that aliases an input again from the input (so that ``out._base``
# is the input, as in eager); for a Function's result that routed the gradient around the
# Function's backward: torch's ``test_input_output_aliase_custom_autograd_function`` got 1.0, not
# 0.5. Such a result is returned as the compiled Function made it (torch's
# ``custom_function_view``), also when it is viewed after (where torch 2.13's own path misses).


class _HalfOfARow(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x[1:]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.zeros_like(grad[:1]), grad * 0.5])


class _InputAndDouble(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x * 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, grad_double: torch.Tensor) -> torch.Tensor:
        return grad * 0.5 + grad_double * 3


ALIASING_RESULTS: dict[str, Callable[..., Any]] = {
    "returns_its_input": lambda x: _ReturnsItsInput.apply(x),  # torch's test
    "returns_a_view_of_its_input": lambda x: _HalfOfARow.apply(x),
    "returns_its_input_and_more": lambda x: _InputAndDouble.apply(x),
    "result_and_the_input": lambda x: (_ReturnsItsInput.apply(x), x),
}


def _aliasing_step(fn: Callable[..., Any]) -> tuple[list[torch.Tensor], torch.Tensor, list[bool]]:
    """Outputs, the input's gradient under a loss weighing each position, and which outputs view the input."""
    x = torch.ones(2, 2, requires_grad=True)
    out = fn(x)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    sum((o * torch.linspace(-1.0, 2.0, o.numel()).view(o.shape)).sum() for o in outs).backward()
    assert x.grad is not None
    return [o.detach() for o in outs], x.grad, [o._base is x or o is x for o in outs]


def _compiled_through(entry: str, fn: Callable[..., Any], pipeline: str) -> Callable[..., Any]:
    torch._dynamo.reset()
    if entry == "dynamo":
        return torch.compile(fn, backend=passkit.backend(pipeline), fullgraph=True)
    return passkit.aot_function(fn, pipeline=pipeline)


@pytest.mark.parametrize("entry", ["dynamo", "aot_function"])
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("program", ALIASING_RESULTS)
def test_a_functions_result_aliasing_its_input_keeps_the_functions_backward(program: str, pipeline: str, entry: str) -> None:
    fn = ALIASING_RESULTS[program]
    expected = _aliasing_step(fn)
    torch._dynamo.reset()
    torch.testing.assert_close(_aliasing_step(torch.compile(fn, backend="aot_eager", fullgraph=True))[:2], expected[:2])
    actual = _aliasing_step(_compiled_through(entry, fn, pipeline))
    torch.testing.assert_close(actual[:2], expected[:2])
    assert actual[2] == expected[2]


def test_the_issues_function_gets_half_the_gradient() -> None:
    x = torch.ones(2, 2, requires_grad=True)
    passkit.aot_function(lambda t: _ReturnsItsInput.apply(t), pipeline="training-python")(x).sum().backward()
    assert x.grad.tolist() == [[0.5, 0.5], [0.5, 0.5]]


@pytest.mark.parametrize("entry", ["dynamo", "aot_function"])
def test_a_view_of_a_functions_result_keeps_the_functions_backward(entry: str) -> None:
    # torch 2.13's aot_eager gives x's gradient here (1.0 where eager's is 0.5): it makes the
    # view again from the input. passkit is held to eager's.
    def fn(x: torch.Tensor) -> torch.Tensor:
        return _ReturnsItsInput.apply(x).t()

    actual = _aliasing_step(_compiled_through(entry, fn, "training-python"))
    expected = _aliasing_step(fn)
    torch.testing.assert_close(actual[:2], expected[:2])
    assert actual[2] == expected[2]


# -- a backward that writes to what it reads ------------------------------------------------------


class _BackwardTransposesASavedInput(torch.autograd.Function):
    # torch's test_backward_mutation_metadata
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(b)
        return a.clone(), b.clone()

    @staticmethod
    def backward(ctx: Any, grad_a: torch.Tensor, grad_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (b,) = ctx.saved_tensors
        b.transpose_(1, 0)
        return grad_a.clone(), grad_b.clone()


class _BackwardTransposesItsGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad.t_()
        return grad.clone().t()


def _transposes_a_saved_input(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a_, b_ = _BackwardTransposesASavedInput.apply(a, b)
    return a_ * b_


def _transposes_its_gradient(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _BackwardTransposesItsGradient.apply(a * b)


BACKWARD_METADATA_WRITES = {
    "saved_input": (
        _transposes_a_saved_input,
        "Found a graph input that had its metadata mutated in the backward. This is not supported",
        "steps[3] (joint) failed: PasskitError: Found a graph input that had its "
        "metadata mutated in the backward. This is not supported (input 1, arg1_1) "
        "(after: functionalize, decompose, attention)",
    ),
    "gradient": (
        _transposes_its_gradient,
        "Found an input to the backward that had metadata mutated during the backward pass. This is not supported",
        "steps[3] (joint) failed: PasskitError: Found an input to the backward that "
        "had metadata mutated during the backward pass. This is not supported (the gradient of output 0) "
        "(after: functionalize, decompose, attention)",
    ),
}


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("case", BACKWARD_METADATA_WRITES)
def test_a_backward_that_changes_an_inputs_metadata_is_refused_in_torchs_words(case: str, pipeline: str) -> None:
    from functorch.compile import aot_function, nop

    fn, torchs_reason, message = BACKWARD_METADATA_WRITES[case]

    def inputs() -> list[torch.Tensor]:
        return [torch.ones(3, 3, requires_grad=True), torch.ones(3, 3, requires_grad=case == "gradient")]

    with pytest.raises(AssertionError, match=torchs_reason):
        aot_function(fn, nop)(*inputs()).sum().backward()
    compiled = passkit.aot_function(fn, pipeline=pipeline, repro_dir="")
    with pytest.raises(passkit.PasskitError) as refused:
        compiled(*inputs())
    if pipeline == "training":  # the regions step runs first there
        message = message.replace("steps[3]", "steps[4]").replace("after: ", "after: regions, ")
    where, what = str(refused.value).split(".toml: ", 1)
    assert where.endswith(f"pipelines/{pipeline}")  # the shipped file, as the path it is loaded from
    assert what == message
