"""A jagged ``NestedTensor`` built inside the compiled function from plain inputs, then a ``Linear``.

Building one draws its ragged size (a nested int) from the fake mode's ShapeEnv, so such a
graph gets one (``needs_shape_env``; it failed with "self.shape_env must not be None"), and a
composite op on it (``linear``) goes to the NestedTensor's own rule, not ATen's decomposition,
which handed the op back to it without end.

Training differentiates at the NestedTensor's level, as torch's AOT path does (``aot_eager``,
checked here): passkit's forward-only traces run its ops below its autograd rules (``values()``
became a ``detach``, so the Linear got no gradient), so ``joint`` differentiates the captured
graph with autograd instead, tracing the size arithmetic of the tensors it builds only where an
op reads it. The gradients of ``a`` and ``b`` are None in eager too: the constructor copies.
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
def test_passkit_trains_a_nested_tensor_built_inside_as_eager(fn: Any, backend: str) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    expected = _run(fn, copy.deepcopy(lin), grad=True)
    compiled, compiler = _compiled(fn, backend)
    actual = _run(compiled, lin, grad=True)
    torch.testing.assert_close(actual, expected)
    assert actual[3] is not None and actual[3].abs().sum() > 0  # the Linear's weight got its gradient
    assert compiler.reports[0].graph.endswith("training")


@FUNCTIONS
def test_every_step_keeps_eagers_numerics(fn: Any) -> None:
    # The offsets built inside are a constant lifted by ``lift_fresh_copy``, which joint's
    # trace records as it is: it must leave the graph inside the target opset.
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    expected = _run(fn, copy.deepcopy(lin), grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=passkit.backend("training-python", verify="numerics"))
    torch.testing.assert_close(_run(compiled, lin, grad=True), expected)
