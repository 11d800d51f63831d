"""Cases from torch's own ``test/functorch/test_aotdispatch.py``, checked the way torch checks them.

``_verify`` follows torch's ``verify_aot_autograd``: eager and compiled runs on copies of the
inputs (non-leaves under ``test_mutation``), then gradients, each output's value,
``requires_grad``, ``is_leaf`` and aliasing, an in-place change to each output, and the inputs
afterwards. Where torch's AOT Autograd raises or eager raises autograd's own error, so must
passkit; where passkit cannot reproduce eager, it refuses with one line.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch.utils import _pytree as pytree

import passkit

PIPELINES = ["training-python", "training"]

def _base(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._is_view() else t


def _aliases(t: torch.Tensor, others: list[Any]) -> bool:
    return any(isinstance(o, torch.Tensor) and _base(t) is _base(o) for o in others)


def _outs_and_grads(fn: Callable[..., Any], graph_inputs: list[Any], leaves: list[Any]) -> tuple[Any, list[Any]]:
    outs = fn(*graph_inputs)
    for out in pytree.tree_leaves(outs):
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.sum().backward(retain_graph=True)
    grads = [x.grad if isinstance(x, torch.Tensor) else None for x in leaves]
    return outs, grads


def _inputs(examples: list[Any], test_mutation: bool) -> tuple[list[Any], list[Any]]:
    leaves = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in examples]
    return leaves, [x.add(1) for x in leaves] if test_mutation else leaves


def _verify(fn: Callable[..., Any], examples: list[Any], pipeline: str, *, test_mutation: bool = False) -> None:
    leaves, graph_inputs = _inputs(examples, test_mutation)
    test_leaves, test_graph_inputs = _inputs(examples, test_mutation)
    expected, expected_grads = _outs_and_grads(fn, graph_inputs, leaves)
    actual, grads = _outs_and_grads(passkit.aot_function(fn, pipeline=pipeline), test_graph_inputs, test_leaves)
    torch.testing.assert_close(grads, expected_grads)
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    actual = [actual] if isinstance(actual, torch.Tensor) else list(actual)
    for k, (e, a) in enumerate(zip(expected, actual)):
        assert (a.requires_grad, a.is_leaf) == (e.requires_grad, e.is_leaf), f"output {k}"
        assert _aliases(a, test_graph_inputs + actual[:k] + actual[k + 1 :]) == _aliases(
            e, graph_inputs + expected[:k] + expected[k + 1 :]
        ), f"output {k} aliasing"
        torch.testing.assert_close(a, e)
        if test_mutation:
            e.add_(2)
            a.add_(2)
            torch.testing.assert_close(a, e)
    for e, a in zip(leaves, test_leaves):
        assert a.requires_grad == e.requires_grad
        torch.testing.assert_close(a, e)


@pytest.fixture(params=PIPELINES)
def pipeline(request: pytest.FixtureRequest) -> str:
    return request.param


# -- writes hidden from autograd (under no_grad, through .detach()) ----------------------------


@pytest.mark.parametrize("requires_grad", [True, False])
def test_view_detach(pipeline: str, requires_grad: bool) -> None:
    def f(a):
        tmp = a.detach()
        a.mul_(2)
        return a, tmp

    _verify(f, [torch.ones(3, 3, requires_grad=requires_grad)], pipeline, test_mutation=True)


@pytest.mark.parametrize("test_mutation", [False, True], ids=["leaf", "non_leaf"])
def test_input_mutation_requires_grad_detach(pipeline: str, test_mutation: bool) -> None:
    # The write through the detached alias keeps a's history: the gradient of a + 3 is one.
    def f(a):
        a.detach().mul_(2)
        return a * 3

    _verify(f, [torch.ones(4, requires_grad=True)], pipeline, test_mutation=test_mutation)


def test_input_mutation_hidden_from_autograd_aliasing(pipeline: str) -> None:
    def f(a):
        a_alias = a.view(-1)
        with torch.no_grad():
            a_alias.mul_(2)
        return a + 1

    _verify(f, [torch.ones(4, requires_grad=True)], pipeline, test_mutation=True)


def test_several_hidden_writes_to_an_input_and_no_use_between(pipeline: str) -> None:
    def f(a):
        a.detach().mul_(2)
        with torch.no_grad():
            a.add_(1)
        return a * 4

    _verify(f, [torch.ones(4, requires_grad=True)], pipeline, test_mutation=True)


def test_hidden_write_to_an_intermediate_nobody_uses_after(pipeline: str) -> None:
    def f(a):
        b = a * 2
        b.detach().mul_(3)
        return a * 4

    _verify(f, [torch.ones(4, requires_grad=True)], pipeline, test_mutation=True)


def _mixed(a):
    a.detach().mul_(2)
    a.mul_(3)
    with torch.no_grad():
        a.mul_(4)
    return a + 5


def _used_between(a):
    with torch.no_grad():
        a.mul_(2)
    b = a * 5
    with torch.no_grad():
        a.mul_(3)
    return b, a + 1


def _intermediate_used_after(a):
    b = a * 2
    with torch.no_grad():
        b.mul_(3)
    return b + 1


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(_mixed, id="input_mutation_requires_grad_no_grad_detach_mixed"),
        pytest.param(_used_between, id="input_used_between_two_hidden_writes"),
        pytest.param(_intermediate_used_after, id="intermediate_used_after_hidden_write"),
    ],
)
def test_hidden_write_that_autograd_then_uses_trains_as_eager(fn: Callable[..., Any], pipeline: str) -> None:
    # The functional graph computes the new value inside no_grad/detach, where its gradient is
    # lost (eager: 3 for the mixed case); capture keeps the traced graph for joint instead.
    _verify(fn, [torch.ones(4, requires_grad=True)], pipeline, test_mutation=True)


# -- requires_grad and is_leaf of outputs --------------------------------------------------------


def test_inner_grad(pipeline: str) -> None:
    # The gradient computed inside is a leaf that needs no grad (a pre-dispatch trace froze the
    # saved value of exp as a fake constant: the output was a FakeTensor).
    def foo(x):
        y = torch.exp(x)
        return torch.autograd.grad(y, x)

    _verify(foo, [torch.randn((), requires_grad=True)], pipeline)


def test_some_output_requires_grad_input_doesnt(pipeline: str) -> None:
    def f(a, b):
        a_view = a.view(-1)
        a_view.requires_grad_(True)
        return a_view

    _verify(f, [torch.randn(3, 3), torch.randn(3, 3, requires_grad=True)], pipeline)


@pytest.mark.parametrize("view", [True, False], ids=["view", "non_view"])
def test_some_outputs_dont_require_grad(pipeline: str, view: bool) -> None:
    def f(a, b):
        return (a.detach() if view else a.add(1).detach()), b

    _verify(f, [torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)], pipeline)


# -- outputs that view an intermediate ------------------------------------------------------------


def test_output_aliases_intermediate_mutation_linear(pipeline: str) -> None:
    # Eager allows an in-place write to a view of an intermediate; autograd forbids it on a view
    # made inside an autograd.Function, so the runtime makes the view outside it.
    _verify(lambda x: (x + 1).view(-1), [torch.ones(3, 3, requires_grad=True)], pipeline, test_mutation=True)


@pytest.mark.parametrize(
    "fn",
    [
        pytest.param(lambda x: (x * 2).t()[1:], id="transposed_slice"),
        pytest.param(lambda x: ((x * 2)[:, 1], x.sin()), id="column_and_other_output"),
        pytest.param(lambda x: ((x + 1).view(-1), (x * 3).view(9)), id="two_intermediates"),
    ],
)
def test_written_views_of_intermediates_backpropagate_as_in_eager(pipeline: str, fn: Callable[..., Any]) -> None:
    x = torch.randn(3, 3)
    expected_x, actual_x = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    expected, actual = fn(expected_x), passkit.aot_function(fn, pipeline=pipeline)(actual_x)
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    actual = [actual] if isinstance(actual, torch.Tensor) else list(actual)
    for e, a in zip(expected, actual):
        e.mul_(torch.arange(e.numel(), dtype=e.dtype).view(e.shape))
        a.mul_(torch.arange(a.numel(), dtype=a.dtype).view(a.shape))
    sum((e * e).sum() for e in expected).backward()
    sum((a * a).sum() for a in actual).backward()
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(actual_x.grad, expected_x.grad)


# -- errors eager or torch's AOT Autograd raise ---------------------------------------------------


def test_output_aliases_input_multi_output_view_should_raise_autograd_error(pipeline: str) -> None:
    compiled = passkit.aot_function(lambda a: list(a.unbind(0)), pipeline=pipeline)
    message = "Such functions do not allow the output views"
    with pytest.raises(RuntimeError, match=message):
        compiled(torch.ones(3, 3, requires_grad=True).clone())[0].mul_(2)
    inp = torch.ones(3, 3, requires_grad=True).clone()
    out = compiled(inp)
    inp.mul_(2)
    with pytest.raises(RuntimeError, match=message):
        out[0].grad_fn
    # Unmodified, the views backpropagate as eager's.
    x = torch.ones(3, 3, requires_grad=True)
    sum(compiled(x * 1)).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3, 3))


def test_set__and_data_mutation_bad(tmp_path: Any) -> None:
    def f(a):
        a_view = a.view(-1)
        tmp = torch.ones(3, 3, requires_grad=True)
        with torch.no_grad():
            a.set_(tmp)
            a_view.mul_(2)
        return a + tmp

    with pytest.raises(RuntimeError, match="cannot mutate tensors with frozen storage"):
        compiled = passkit.aot_function(f, pipeline="training-python", repro_dir=str(tmp_path / "repro"))
        compiled(torch.ones(3, 3, requires_grad=True).add(1))
    assert torch.is_grad_enabled()  # the failed trace left its no_grad region
