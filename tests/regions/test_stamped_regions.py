"""A region call that Dynamo stamped out with another layer's parameters is refused in one line,
whatever ``on_error`` says; regions marked on the class compile and match eager."""

from __future__ import annotations

import types

import pytest
import torch

import passkit
from passkit.regions.stamped import StampedRegionError


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) + x


class MarkedBlock(Block):
    @torch.compiler.nested_compile_region
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) + x


def _stack(block: type[Block]) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(block() for _ in range(4)))


@pytest.mark.parametrize("on_error", ["raise", "eager"])
def test_a_region_marked_per_instance_is_refused_since_torch_stamps_it_with_another_layers_weights(on_error: str) -> None:
    model = _stack(Block)
    marked = torch.compiler.nested_compile_region(lambda self, x: Block.forward(self, x))
    for layer in model:
        layer.forward = types.MethodType(marked, layer)  # type: ignore[method-assign]
    x = torch.randn(2, 8, requires_grad=True)
    torch._dynamo.reset()
    torchs_own_path_is_right = torch.allclose(torch.compile(model, backend="aot_eager")(x), model(x))
    torch._dynamo.reset()
    compiled = passkit.compile(model, pipeline="training-python", on_error=on_error)
    if torchs_own_path_is_right:  # torch 2.11: Dynamo gives each call its own layer's parameters
        torch.testing.assert_close(compiled(x), model(x))
        return
    with pytest.raises(StampedRegionError) as info:
        compiled(x)
    assert str(info.value) == (
        "passkit: Dynamo's region call for layer fn.1 reads fn.0.lin.weight, another layer's parameter, and none "
        "of its own (torch stamps out a nested_compile_region bound to each instance with the first layer's "
        "parameters); mark the class's forward with @torch.compiler.nested_compile_region instead"
    )


def test_a_region_marked_on_the_class_compiles_and_matches_eager() -> None:
    model = _stack(MarkedBlock)
    x = torch.randn(2, 8, requires_grad=True)
    expected = model(x)
    expected.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = passkit.compile(model, pipeline="training-python")
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, expected)
    for param, grad in zip(model.parameters(), grads):
        torch.testing.assert_close(param.grad, grad)
    program = compiled.passkit_backend.programs[0]
    calls = [
        node for gm in program.graphs.values() for module in gm.modules() if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes if node.target is torch.ops.higher_order.invoke_subgraph
    ]
    assert calls  # the layers did reach passkit as stamped-out region calls
