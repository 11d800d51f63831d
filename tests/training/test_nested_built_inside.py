"""A jagged ``NestedTensor`` built inside the compiled function from plain inputs, then a ``Linear``.

Inference matches eager: building one draws its ragged size (a nested int) from the fake mode's
ShapeEnv, so such a graph gets one (``needs_shape_env``; it failed with "self.shape_env must not
be None"), and a composite op on it (``linear``) goes to the NestedTensor's own rule, not ATen's
decomposition, which handed the op back to it without end.

Training is refused in one line: passkit's forward-only traces run the NestedTensor's ops below
its autograd rules (``values()`` became a ``detach``, so the Linear got no gradient), where
torch's AOT path (``aot_eager``, checked here) differentiates at the subclass level.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import passkit

BACKENDS = ["training", "training-python", "aot_eager"]


def _values(lin: torch.nn.Linear, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    nt = torch.nested.nested_tensor([a, b], layout=torch.jagged)
    return torch.relu(lin(nt)).values()


def _nested(lin: torch.nn.Linear, a: torch.Tensor, b: torch.Tensor) -> Any:
    nt = torch.nested.nested_tensor([a, b], layout=torch.jagged)
    return lin(nt)


def _run(fn: Any, lin: torch.nn.Linear, *, grad: bool) -> tuple[Any, ...]:
    torch.manual_seed(1)
    a = torch.randn(2, 4, requires_grad=grad)
    b = torch.randn(3, 4, requires_grad=grad)
    if not grad:
        with torch.no_grad():
            return (fn(lin, a, b),)
    out = fn(lin, a, b)
    values = out.values() if out.is_nested else out
    values.backward(torch.linspace(0.5, 1.5, values.numel()).reshape(values.shape))
    return values.detach(), a.grad, b.grad, lin.weight.grad, lin.bias.grad


def _compiled(fn: Any, backend: str) -> tuple[Any, Any]:
    torch._dynamo.reset()
    compiler = backend if backend == "aot_eager" else passkit.backend(backend)
    return torch.compile(fn, backend=compiler), compiler


FUNCTIONS = pytest.mark.parametrize("fn", [_values, _nested], ids=["plain_output", "nested_output"])


@pytest.mark.parametrize("backend", BACKENDS)
@FUNCTIONS
def test_nested_tensor_built_inside_infers_as_eager(fn: Any, backend: str) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    (expected,) = _run(fn, copy.deepcopy(lin), grad=False)
    compiled, compiler = _compiled(fn, backend)
    (actual,) = _run(compiled, lin, grad=False)
    if fn is _nested:
        assert actual.is_nested
        expected, actual = expected.values(), actual.values()
    torch.testing.assert_close(actual, expected)
    if backend != "aot_eager":
        assert compiler.reports, "passkit compiled nothing"


@FUNCTIONS
def test_torchs_own_aot_path_trains_a_nested_tensor_built_inside(fn: Any) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    expected = _run(fn, copy.deepcopy(lin), grad=True)
    compiled, _ = _compiled(fn, "aot_eager")
    torch.testing.assert_close(_run(compiled, lin, grad=True), expected)


@pytest.mark.parametrize("backend", ["training", "training-python"])
@FUNCTIONS
def test_training_through_a_nested_tensor_built_inside_is_refused(fn: Any, backend: str) -> None:
    lin = torch.nn.Linear(4, 3)
    compiled, _ = _compiled(fn, backend)
    with pytest.raises(passkit.PasskitError) as info:
        _run(compiled, lin, grad=True)
    assert str(info.value) == (
        "passkit: the program builds a jagged NestedTensor from plain tensors and trains through it; "
        "passkit differentiates subclasses only when they are inputs: build it outside the compiled "
        'function and pass it in, or use on_error = "eager"'
    )
    torch._dynamo.reset()
    fallback = torch.compile(fn, backend=passkit.backend(backend, on_error="eager"))
    with pytest.warns(RuntimeWarning):
        actual = _run(fallback, lin, grad=True)
    torch.manual_seed(0)
    fresh = torch.nn.Linear(4, 3)
    fresh.load_state_dict(lin.state_dict())
    lin.zero_grad(set_to_none=True)
    torch.testing.assert_close(actual[0], _run(fn, fresh, grad=True)[0])
