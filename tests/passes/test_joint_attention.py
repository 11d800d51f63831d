"""``joint`` and fused attention on the GPU: a forward traced before the joint asked the efficient
and cuDNN kernels for no log-sum-exp (nothing required grad yet), and the joint's backward then
failed on the GPU ("LSE is not correctly aligned"). The joint now asks for it."""

from __future__ import annotations

import copy
import operator
from typing import Any

import pytest
import torch

import passkit
from passkit import _torch

aten = torch.ops.aten


def _attention_graph(op: Any) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    q, k, v = (graph.placeholder(name) for name in "qkv")
    call = graph.call_function(op, (q, k, v, None, False))
    graph.output(graph.call_function(operator.getitem, (call, 0)))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("op", [aten._scaled_dot_product_efficient_attention.default,
                                aten._scaled_dot_product_cudnn_attention.default], ids=["efficient", "cudnn"])
def test_fused_attention_is_asked_for_the_statistics_its_backward_reads(op) -> None:
    gm = _attention_graph(op)
    assert _torch.attention_statistics_kept(gm) == 1
    (call,) = [n for n in gm.graph.nodes if n.target is op]
    assert call.args[3:5] == (None, True)
    assert "True" in gm.code
    assert _torch.attention_statistics_kept(gm) == 0


def test_an_op_without_the_argument_is_left_alone() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(aten.relu.default, (x,)))
    assert _torch.attention_statistics_kept(torch.fx.GraphModule(torch.nn.Module(), graph)) == 0


class _Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(64, 192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(4, 12, 3, 4, 16).permute(2, 0, 3, 1, 4)
        mask = torch.ones(12, 12, dtype=torch.bool, device=x.device).tril()
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_attention_with_a_mask_trains_on_the_gpu_as_in_eager(dtype) -> None:
    # float32 runs the efficient kernel, bfloat16 the cuDNN one on an H200 (torch 2.11).
    torch.manual_seed(0)
    model = _Attention().to("cuda", dtype)
    twin = copy.deepcopy(model)
    x = torch.randn(4, 12, 64, device="cuda", dtype=dtype)
    compiled = torch.compile(twin, backend=passkit.backend(pipeline="training"))
    compiled(x).float().square().mean().backward()
    model(x).float().square().mean().backward()
    tolerance = {"atol": 1e-4, "rtol": 1e-3} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **tolerance, msg=name)
