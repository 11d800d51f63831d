"""What torch 2.14 and 2.15 changed that passkit depends on, shown on each release.

Each test names the release that changed the behaviour and asserts both sides: torch's own path
as that release gives it, and passkit's result, which must be right on every release. When a
later torch changes it again, the test that fails says which branch in ``passkit/_torch`` to
revisit (docs/torch-versions.md lists them).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import passkit
from passkit._torch.versions import TORCH_2_14, TORCH_2_15
from passkit.examples import transformer

pytestmark = pytest.mark.slow


class _VectorNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x, 2, dim=-1) * 2


def _ops(exported: torch.export.ExportedProgram) -> set[str]:
    return {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}


def test_core_aten_decomposes_vector_norm_from_torch_2_14() -> None:
    # torch 2.14 added linalg_vector_norm to its Core ATen decompositions (2.13 keeps the op whole,
    # a Core ATen op there); passkit's `export` pipeline follows the table of the torch it runs on.
    x = torch.randn(4, 8)
    theirs = _ops(torch.export.export(_VectorNorm(), (x,)).run_decompositions())
    exported = passkit.export(_VectorNorm(), (x,))
    assert ("aten.linalg_vector_norm.default" in theirs) == (not TORCH_2_14)
    assert _ops(exported) == theirs
    torch.testing.assert_close(exported.module()(x), _VectorNorm()(x))


class _MarkedBlock(transformer.Block):
    forward = torch.compiler.nested_compile_region(transformer.Block.forward)


def _marked_stack() -> nn.Module:
    torch.manual_seed(0)
    stack = transformer.TransformerStack(2, 32, 4)
    for block in stack.blocks:
        block.__class__ = _MarkedBlock
    return stack


def test_dynamo_2_15_cannot_trace_a_marked_body_reading_a_float_and_passkit_compiles_it() -> None:
    # Each LayerNorm's eps is a float the marked body reads; under dynamic=True torch 2.15's
    # Dynamo fails on it with every backend (passkit/_torch/dynamo_settings.py).
    x = torch.randn(3, 8, 32)
    torch._dynamo.reset()
    theirs = torch.compile(_marked_stack(), backend="eager", dynamic=True)
    if TORCH_2_15:
        with pytest.raises(Exception, match="Freevar has no source"):
            theirs(x)
    else:
        torch.testing.assert_close(theirs(x), _marked_stack()(x))
    torch._dynamo.reset()
    model = _marked_stack()
    eager = copy.deepcopy(model)
    ours = passkit.compile(model, pipeline="training-python", cache="off", dynamic=True)
    for batch in (2, 5):
        x = torch.randn(batch, 8, 32)
        ours(x).square().sum().backward()
        eager(x).square().sum().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
