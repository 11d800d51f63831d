"""Whole models train exactly as in eager: outputs, gradients and buffers, in train and eval."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from passkit.examples.convnet import ConvBN
from passkit.examples.transformer import MLP, Block

from training_harness import ENTRIES, assert_compiled, compiled_with


def _train_steps(model: nn.Module, runner: nn.Module, x: torch.Tensor, steps: int) -> list[torch.Tensor]:
    outs = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        out = runner(x.clone())
        (out**2).mean().backward()
        outs.append(out.detach())
        optimizer.step()
    return outs


def assert_trains_like_eager(make: type[nn.Module], x: torch.Tensor, entry: str, *, train: bool, steps: int = 2) -> None:
    torch.manual_seed(0)
    eager = make()
    twin = copy.deepcopy(eager)
    eager.train(train)
    twin.train(train)
    compiled = compiled_with(entry, twin)
    expected = _train_steps(eager, eager, x, steps)
    actual = _train_steps(twin, compiled, x, steps)
    for step, (e, a) in enumerate(zip(expected, actual)):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5, msg=lambda m: f"step {step} output: {m}")
    for (name, p_e), p_a in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p_a.grad, p_e.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"grad {name}: {m}")
        torch.testing.assert_close(p_a, p_e, rtol=1e-5, atol=1e-5, msg=lambda m: f"param {name}: {m}")
    for (name, b_e), b_a in zip(eager.named_buffers(), twin.buffers()):
        torch.testing.assert_close(b_a, b_e, rtol=1e-5, atol=1e-5, msg=lambda m: f"buffer {name}: {m}")
    assert_compiled(compiled)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_mlp_with_layernorm_and_gelu(entry: str, train: bool) -> None:
    assert_trains_like_eager(lambda: MLP(16, 32), torch.randn(8, 16), entry, train=train)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_causal_self_attention_block(entry: str, train: bool) -> None:
    assert_trains_like_eager(lambda: Block(32, 4), torch.randn(2, 8, 32), entry, train=train)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_conv_batchnorm_running_stats_match_after_two_steps(entry: str, train: bool) -> None:
    assert_trains_like_eager(ConvBN, torch.randn(4, 3, 6, 6), entry, train=train, steps=2)


@pytest.mark.parametrize("entry", ENTRIES)
def test_inference_under_no_grad_skips_joint_and_partition(entry: str) -> None:
    torch.manual_seed(0)
    model = ConvBN().eval()
    compiled = compiled_with(entry, copy.deepcopy(model))
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    (report,) = compiled.passkit_reports
    skipped = {r.id for r in report.records if r.status == "skipped"}
    assert {"joint", "partition.default"} <= skipped


def test_later_calls_reuse_the_compiled_artifact() -> None:
    torch.manual_seed(0)
    model = MLP(16, 32)
    compiled = compiled_with("compile", model)
    for _ in range(3):
        compiled(torch.randn(8, 16)).sum().backward()
    assert len(compiled.passkit_reports) == 1
