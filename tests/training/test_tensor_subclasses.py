"""Tensor subclasses among the inputs, parameters and outputs compile and match eager.

``flatten_subclasses`` takes ``TwoTensor`` and the jagged ``NestedTensor`` apart before any pass
runs; the compiled program returns subclass outputs and gives subclass gradients, as eager and
``torch.compile(backend="aot_eager")`` do. Each case runs on the default pipeline (``training``,
Inductor's code generator) and on ``training-python``.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import passkit

PIPELINES = ["training", "training-python"]


def _two(seed: int, shape: tuple[int, ...] = (3, 4), requires_grad: bool = False) -> TwoTensor:
    generator = torch.Generator().manual_seed(seed)
    a, b = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    return TwoTensor(a, b).requires_grad_(requires_grad)


def _parts(value: Any) -> list[torch.Tensor]:
    if isinstance(value, TwoTensor):
        return [value.a, value.b]
    if getattr(value, "is_nested", False):
        return [value.values(), value.offsets()]
    return [value]


def _assert_same(actual: Any, expected: Any, what: str) -> None:
    assert type(actual) is type(expected), f"{what}: {type(actual).__name__}, eager gives {type(expected).__name__}"
    for got, want in zip(_parts(actual), _parts(expected)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")


def _compiled(fn: Callable[..., Any], pipeline: str) -> Any:
    torch._dynamo.reset()
    compiled = passkit.compile(fn, pipeline)
    return compiled


def _assert_compiled_plain(compiled: Any) -> None:
    """passkit compiled the program, and every graph a pass saw holds plain tensors only."""
    backend = compiled.passkit_backend
    assert backend.reports and not compiled.passkit_fallbacks
    for program in backend.programs:
        assert program.signature.subclass_inputs or program.signature.subclass_outputs
        for gm in program.graphs.values():
            for node in gm.graph.nodes:
                value = node.meta.get("val")
                assert not isinstance(value, torch.Tensor) or type(value).__name__ == "FakeTensor", node.format_node()


def _sin_twice(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (x * 2).sin() + y, x.cos()


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "training"])
def test_a_two_tensor_input_and_output_match_eager(pipeline: str, requires_grad: bool) -> None:
    x, y = _two(0, requires_grad=requires_grad), torch.randn(3, 4)
    x_eager, x_aot = _two(0, requires_grad=requires_grad), _two(0, requires_grad=requires_grad)
    compiled = _compiled(_sin_twice, pipeline)
    out = compiled(x, y)
    expected = _sin_twice(x_eager, y)
    torch._dynamo.reset()
    aot = torch.compile(_sin_twice, backend="aot_eager")(x_aot, y)
    _assert_compiled_plain(compiled)
    for k in range(2):
        _assert_same(out[k], expected[k], f"output {k}")
        _assert_same(aot[k], expected[k], f"aot_eager output {k}")
    assert out[0].requires_grad == requires_grad
    if requires_grad:
        for outs in (out, expected):
            ((outs[0] * outs[0]).sum() + outs[1].sum()).backward()
        _assert_same(x.grad, x_eager.grad, "x.grad")


def _two_tensor_linear() -> torch.nn.Linear:
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    for name in ("weight", "bias"):
        value = getattr(linear, name).detach()
        setattr(linear, name, torch.nn.Parameter(TwoTensor(value.clone(), value * 2)))
    return linear


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_two_tensor_parameters_get_two_tensor_gradients(pipeline: str) -> None:
    eager, model = _two_tensor_linear(), _two_tensor_linear()
    x = torch.randn(2, 4)
    compiled = _compiled(model, pipeline)
    out, expected = compiled(x), eager(x)
    _assert_compiled_plain(compiled)
    _assert_same(out, expected, "output")
    (out * out).sum().backward()
    (expected * expected).sum().backward()
    for (name, want), got in zip(eager.named_parameters(), model.parameters()):
        _assert_same(got.grad, want.grad, f"{name}.grad")


def test_the_signature_records_the_subclass_structure() -> None:
    compiled = _compiled(_sin_twice, "training-python")
    compiled(_two(0, requires_grad=True), torch.randn(3, 4))
    signature = compiled.passkit_backend.programs[0].signature
    assert [(s.position, s.layout, s.flat) for s in signature.subclass_inputs] == [(0, "TwoTensor(a, b)", (0, 1))]
    assert [(s.position, s.layout, s.flat) for s in signature.subclass_outputs] == [
        (0, "TwoTensor(a, b)", (0, 1)), (1, "TwoTensor(a, b)", (2, 3))
    ]
    assert [info.name for info in signature.inputs] == ["l_x__a", "l_x__b", "l_y_"]


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_plain_parameter_whose_eager_gradient_is_a_subclass_gets_it(pipeline: str) -> None:
    # Eager gives the plain bias a TwoTensor gradient: the compiled backward returns its inner
    # tensors and the runtime builds the TwoTensor.
    eager, model = _two_tensor_linear(), _two_tensor_linear()
    for linear in (eager, model):
        linear.bias = torch.nn.Parameter(torch.zeros(3))
    x = torch.randn(2, 4)
    compiled = _compiled(model, pipeline)
    out, expected = compiled(x), eager(x)
    _assert_same(out, expected, "output")
    out.sum().backward()
    expected.sum().backward()
    for name in ("weight", "bias"):
        _assert_same(getattr(model, name).grad, getattr(eager, name).grad, f"{name}.grad")
    assert isinstance(model.bias.grad, TwoTensor)


class _Opaque(torch.Tensor):
    """A subclass without ``__tensor_flatten__``: nothing can take it apart."""


def test_a_subclass_that_cannot_be_flattened_is_a_one_line_error() -> None:
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: (x * 2).sin(), backend=passkit.backend("training-python"))
    with pytest.raises(passkit.PasskitError) as info:
        compiled(torch.randn(3).as_subclass(_Opaque))
    assert str(info.value) == (
        "passkit: input 'l_x_' is a tensor subclass (_Opaque) without __tensor_flatten__/__tensor_unflatten__, "
        "so it cannot be compiled; implement them, or pass a plain tensor"
    )


def _jagged(requires_grad: bool) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    parts = [torch.randn(2, 4, generator=generator), torch.randn(5, 4, generator=generator)]
    return torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=requires_grad)


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "training"])
def test_a_jagged_nested_tensor_through_a_linear_matches_eager(pipeline: str, requires_grad: bool) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    x, x_eager, x_aot = _jagged(requires_grad), _jagged(requires_grad), _jagged(requires_grad)
    compiled = _compiled(linear, pipeline)
    out = compiled(x)
    _assert_compiled_plain(compiled)
    linear.zero_grad()
    expected = linear(x_eager)
    torch._dynamo.reset()
    aot = torch.compile(linear, backend="aot_eager")(x_aot)
    torch.testing.assert_close(out.values(), expected.values(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(aot.values(), expected.values(), rtol=1e-5, atol=1e-5)
    assert out.is_nested and out.offsets() is x.offsets()
    if requires_grad:
        expected.values().square().sum().backward()
        want = (linear.weight.grad.clone(), linear.bias.grad.clone(), x_eager.grad.values())
        linear.zero_grad()
        out.values().square().sum().backward()
        got = (linear.weight.grad, linear.bias.grad, x.grad.values())
        for name, g, w in zip(("weight", "bias", "x"), got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}.grad: {m}")
        assert x.grad.is_nested


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_aot_module_with_two_tensor_parameters_matches_eager(pipeline: str) -> None:
    eager, model = _two_tensor_linear(), _two_tensor_linear()
    x = _two(3, (2, 4), requires_grad=True)
    x_eager = _two(3, (2, 4), requires_grad=True)
    compiled = passkit.aot_module(model, pipeline)
    out, expected = compiled(x), eager(x_eager)
    assert compiled.passkit_reports and not compiled.passkit_fallbacks
    _assert_same(out, expected, "output")
    assert not out.a.requires_grad and out.requires_grad
    (out * out).sum().backward()
    (expected * expected).sum().backward()
    _assert_same(x.grad, x_eager.grad, "x.grad")
    for (name, want), got in zip(eager.named_parameters(), model.parameters()):
        _assert_same(got.grad, want.grad, f"{name}.grad")
