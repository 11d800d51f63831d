"""Programs torch's own AOT path trains and passkit once refused, each shown three ways.

For each: eager's result, ``backend="aot_eager"`` matching it, and passkit matching it on
``training`` and ``training-python`` through ``torch.compile``. Both programs lose eager's
gradient when their functional forward is differentiated, so capture keeps the captured graph
and ``joint`` differentiates that with autograd (as AOT Autograd does):

- an in-place write autograd does not record (under ``no_grad``, through ``.detach()``) to a
  tensor that autograd then uses: the functional graph computes the new value in a region
  autograd cannot see through, and its gradient was dropped;
- a plain parameter whose gradient is a tensor subclass (a ``TwoTensor`` input times a plain
  weight): the compiled backward returns the gradient's inner tensors and the runtime builds
  the ``TwoTensor`` gradient eager gives.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import passkit

PIPELINES = ["training", "training-python"]


def _hidden_writes_mixed_with_tracked(a: torch.Tensor) -> torch.Tensor:
    a.detach().mul_(2)
    a.mul_(3)
    with torch.no_grad():
        a.mul_(4)
    return a + 5


def _hidden_write_to_an_intermediate(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    b = a * 2
    b.detach().add_(1)
    return (b * w).sin()


def _run_hidden(fn: Callable[..., Any], *, with_weight: bool) -> tuple[Any, ...]:
    torch.manual_seed(0)
    leaf = torch.randn(4, requires_grad=True)
    w = torch.randn(4, requires_grad=True)
    a = leaf.add(1)
    out = fn(a, w) if with_weight else fn(a)
    # The caller's ``a`` after the call: eager's value, and eager's history (a later use of it
    # sends its gradient through the recorded write only).
    (out.sum() + (a * 7).sum()).backward()
    return out.detach(), a.detach(), leaf.grad, w.grad


def _hidden_write_to_a_leaf(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Found by ``passkit fuzz``: the write-back into the leaf was one autograd sees, which eager
    # refuses for a leaf that requires grad ("a leaf Variable that requires grad is being used
    # in an in-place operation").
    return a.detach().add_(1), a * 3


def _run_leaf(fn: Callable[..., Any]) -> tuple[Any, ...]:
    torch.manual_seed(0)
    leaf = torch.randn(2, 4, requires_grad=True)
    hidden, tracked = fn(leaf)
    tracked.sum().backward()
    return hidden, hidden.requires_grad, leaf.detach(), leaf.grad


def _two_tensor_times_plain_weight(x: TwoTensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sum()


def _two_tensor_through_a_linear(x: TwoTensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, w).relu().sum()


def _run_subclass_grad(fn: Callable[..., Any], *, weight_shape: tuple[int, ...]) -> tuple[Any, ...]:
    torch.manual_seed(0)
    x = TwoTensor(torch.randn(2, 3), torch.randn(2, 3))
    w = torch.randn(weight_shape, requires_grad=True)
    fn(x, w).backward()
    assert isinstance(w.grad, TwoTensor)  # in eager, and in every compiled run
    return w.grad.a, w.grad.b


CASES: dict[str, tuple[Callable[..., Any], Callable[[Callable[..., Any]], Any]]] = {
    "in_place_under_no_grad_and_detach_mixed_with_tracked": (
        _hidden_writes_mixed_with_tracked, functools.partial(_run_hidden, with_weight=False),
    ),
    "in_place_through_detach_on_an_intermediate": (
        _hidden_write_to_an_intermediate, functools.partial(_run_hidden, with_weight=True),
    ),
    "in_place_through_detach_on_a_leaf_input": (_hidden_write_to_a_leaf, _run_leaf),
    "plain_parameter_with_a_subclass_gradient": (
        _two_tensor_times_plain_weight, functools.partial(_run_subclass_grad, weight_shape=(3,)),
    ),
    "plain_linear_weight_with_a_subclass_gradient": (
        _two_tensor_through_a_linear, functools.partial(_run_subclass_grad, weight_shape=(5, 3)),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_aot_eager_matches_eager(case: str) -> None:
    fn, run = CASES[case]
    torch._dynamo.reset()
    torch.testing.assert_close(run(torch.compile(fn, backend="aot_eager")), run(fn))


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("case", CASES)
def test_passkit_matches_eager(case: str, pipeline: str) -> None:
    fn, run = CASES[case]
    torch._dynamo.reset()
    backend = passkit.backend(pipeline)
    torch.testing.assert_close(run(torch.compile(fn, backend=backend)), run(fn))
    assert backend.reports, "passkit compiled nothing"


@pytest.mark.parametrize("case", CASES)
def test_every_step_keeps_eagers_numerics(case: str) -> None:
    fn, run = CASES[case]
    torch._dynamo.reset()
    backend = passkit.backend("training-python", verify="numerics")
    torch.testing.assert_close(run(torch.compile(fn, backend=backend)), run(fn))


@pytest.mark.parametrize("case", [c for c in CASES if "subclass_gradient" in c])
def test_a_subclass_gradient_with_symbolic_sizes(case: str) -> None:
    # The recorded gradient layout holds symbols: the runtime builds it as large as the input.
    fn, run = CASES[case]
    torch._dynamo.reset()
    torch.testing.assert_close(run(torch.compile(fn, backend=passkit.backend("training"), dynamic=True)), run(fn))
