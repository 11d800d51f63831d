"""An input that needs grad but gets none from the compiled backward is not backpropagated into.

``passkit fuzz training --seed 70`` found it: a parameter read only by code Dynamo kept after a
graph break (``v1 + v1.nonzero().sum()``, never used) got a zero gradient where eager leaves
``grad`` None, which an optimizer such as AdamW then decays. The second graph takes ``v1`` (not
a leaf), its backward returns None for it, and autograd still called the first graph's backward
with zeros. The runtime now detaches such inputs before the call, as torch's AOT does.
"""

from __future__ import annotations

import pytest
import torch

import passkit

PIPELINES = ["training-python", "training"]


class _DeadAfterABreak(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor]:
        v1 = x @ self.w
        v2 = v1 + v1.nonzero().sum()  # noqa: F841 - read by no output: what the fuzzer drew
        return (x * x,)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_parameter_read_only_by_dead_code_keeps_no_gradient(pipeline: str) -> None:
    grads = {}
    for name, make in [("eager", lambda m: m), ("aot_eager", lambda m: torch.compile(m, backend="aot_eager")),
                       ("passkit", lambda m: passkit.compile(m, pipeline=pipeline, cache="off"))]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model, x = _DeadAfterABreak(), torch.randn(3, 4, requires_grad=True)
        make(model)(x)[0].sum().backward()
        grads[name] = (model.w.grad, x.grad)
    assert grads["eager"][0] is None and grads["aot_eager"][0] is None
    assert grads["passkit"][0] is None
    torch.testing.assert_close(grads["passkit"][1], grads["eager"][1])


def _times_detached(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * y.detach()


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_freed_tape_behind_an_input_without_gradient_is_not_walked_again(pipeline: str) -> None:
    w = torch.randn(4, requires_grad=True)
    y = w * 2
    y.sum().backward()  # frees y's tape
    x = torch.randn(4, requires_grad=True)
    torch._dynamo.reset()
    # Walking y's tape again raised "Trying to backward through the graph a second time".
    passkit.compile(_times_detached, pipeline=pipeline, cache="off")(x, y).sum().backward()
    torch.testing.assert_close(x.grad, y.detach())
    torch.testing.assert_close(w.grad, torch.full((4,), 2.0))
