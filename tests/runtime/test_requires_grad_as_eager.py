"""Written inputs and detached outputs need grad after a compiled call exactly where eager's do.

Both cases were found by ``passkit fuzz`` on ``training-python`` as silent wrong results:

* A value that needs grad written into an input that needs none (``x1.add_(x0)``,
  ``x0.copy_(x1[0])``): eager's in-place op gives the input the value's history, so a loss on it
  reaches the other input. The runtime copied the new value back under ``no_grad`` (and a graph
  whose only output Dynamo returns itself was captured as inference): the gradient was ``None``.
* ``v.detach()`` returned beside ``v``: the compiled graph returns it as ``alias(v)``, a view, and
  autograd leaves a view an ``autograd.Function`` marks non-differentiable needing grad.

Each case runs through Dynamo on both shipped training pipelines and is held to eager and to
torch's own AOT path (``aot_eager``): outputs, their ``requires_grad``, gradients, and the inputs'
values and ``requires_grad`` after the call.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import passkit

PIPELINES = ["training-python", "training"]


def _add_into_input(x0: torch.Tensor, x1: torch.Tensor) -> tuple[torch.Tensor]:
    x1.add_(x0)
    return (x1,)


def _copy_into_input(x0: torch.Tensor, x1: torch.Tensor) -> tuple[torch.Tensor]:
    x0.copy_(x1[0])
    return (x0,)


class _DetachedBesideItsBase(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v1 = x0 @ self.w
        return (v1.detach(), v1)


# name -> (the program, its inputs' shapes and whether each requires grad)
PROGRAMS: dict[str, tuple[Callable[[], Any], list[tuple[tuple[int, ...], bool]]]] = {
    "add_into_input": (lambda: _add_into_input, [((4, 4), True), ((4, 4), False)]),
    "copy_into_input": (lambda: _copy_into_input, [((1, 4), False), ((3, 4), True)]),
    "detached_beside_its_base": (_DetachedBesideItsBase, [((4, 4), False)]),
}


def _step(program: str, backend: str | Any | None) -> dict[str, Any]:
    """One training step: what a user can see of the outputs, inputs and gradients."""
    make, spec = PROGRAMS[program]
    torch.manual_seed(0)
    fn = make()
    inputs = [torch.randn(shape, requires_grad=grad) for shape, grad in spec]
    if backend is not None:
        torch._dynamo.reset()
        fn = torch.compile(fn, backend=backend, fullgraph=True)
    outs = fn(*inputs)
    seen = {
        "outputs": [o.detach().clone() for o in outs],
        "outputs_require_grad": [o.requires_grad for o in outs],
        "inputs_after": [x.detach().clone() for x in inputs],
        "inputs_require_grad": [x.requires_grad for x in inputs],
    }
    # Each position weighed differently: a gradient routed to the wrong place shows.
    loss = sum((o * torch.linspace(-1.0, 2.0, o.numel()).view(o.shape)).sum() for o in outs if o.requires_grad)
    loss.backward()  # type: ignore[union-attr]
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    seen["grads"] = [x.grad for x in inputs if x.is_leaf] + [p.grad for p in params]
    return seen


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("program", PROGRAMS)
def test_requires_grad_and_gradients_match_eager_and_aot_eager(program: str, pipeline: str) -> None:
    expected = _step(program, None)
    assert any(g is not None for g in expected["grads"])
    torch.testing.assert_close(_step(program, "aot_eager"), expected)
    torch.testing.assert_close(_step(program, passkit.backend(pipeline)), expected)


def test_the_reported_add_gives_the_other_input_its_gradient() -> None:
    # The fuzzer's first report: eager's x0.grad is ones, compiled gave None.
    x0, x1 = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4)
    torch._dynamo.reset()
    (out,) = torch.compile(_add_into_input, backend=passkit.backend("training-python"))(x0, x1)
    assert out is x1 and out.grad_fn is not None
    out.sum().backward()
    assert x0.grad is not None and x0.grad.tolist() == torch.ones(4, 4).tolist()
