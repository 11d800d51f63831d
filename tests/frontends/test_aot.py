"""Compiles without Dynamo: aot_function() and aot_module(), and what they key their compiles on."""

from __future__ import annotations

import copy

import torch

import passkit
from passkit.examples.transformer import MLP


def test_aot_module_keeps_state_dict_and_trains() -> None:
    torch.manual_seed(0)
    model = MLP(8, 16)
    twin = copy.deepcopy(model)
    compiled = passkit.aot_module(twin, pipeline="training-python")
    assert compiled.state_dict().keys() == {f"mod.{k}" for k in model.state_dict()}
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), model(x))
    (compiled(x) ** 2).sum().backward()
    (model(x) ** 2).sum().backward()
    for (name, expected), actual in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(actual.grad, expected.grad, msg=lambda m: f"{name}: {m}")


def test_aot_function_takes_pytrees_and_keyword_arguments() -> None:
    def fn(pair, *, scale, bias=None):
        a, b = pair
        out = {"sum": (a + b) * scale}
        if bias is not None:
            out["biased"] = out["sum"] + bias
        return out

    compiled = passkit.aot_function(fn, pipeline="training-python")
    a, b = torch.randn(3, requires_grad=True), torch.randn(3)
    result = compiled((a, b), scale=2.0, bias=torch.ones(3))
    torch.testing.assert_close(result["biased"], (a + b) * 2.0 + 1)
    result["biased"].sum().backward()
    torch.testing.assert_close(a.grad, torch.full((3,), 2.0))
    assert compiled((a, b), scale=3.0)["sum"].shape == (3,)
    assert len(compiled.passkit_reports) == 2  # a new constant is a new specialisation


def test_aot_function_tells_apart_the_same_tensors_nested_differently() -> None:
    def fn(*args):
        flat = [t for arg in args for t in (arg if isinstance(arg, (list, tuple)) else [arg])]
        return sum(t * (k + 1) for k, t in enumerate(flat)) + len(args)

    compiled = passkit.aot_function(fn, pipeline="training-python")
    x, y = torch.randn(3), torch.randn(3)
    w = torch.nn.Parameter(torch.randn(3))
    # Tensors and lists of them are read without pytree, a tuple or a number through it; each
    # nesting, and a tensor of other strides, is its own compile, and each gives eager's value.
    calls = [(x, y), ([x, y],), ([x], y), (x, [y]), ([w, x],), ((x, y),), (x, 2.0), (torch.randn(6)[::2], y)]
    for args in calls:
        torch.testing.assert_close(compiled(*args), fn(*args))
    assert len(compiled.passkit_reports) == 8
    for args in calls:  # a second round compiles nothing
        torch.testing.assert_close(compiled(*args), fn(*args))
    assert len(compiled.passkit_reports) == 8
