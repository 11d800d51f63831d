"""The attention set and dropout on the probabilities: rewritten only when dropout draws nothing.

``dropout(softmax(q @ kᵀ · s + mask)) @ v`` with an active dropout stays as it is, on purpose:
SDPA draws its mask inside its kernel (Philox on CUDA), so seeded training would stop
reproducing eager's masks. With ``p = 0`` or ``training=False`` dropout leaves no op in the
graph, and the form is the plain one, which is rewritten.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import passkit
from dependencies import require_module
from tiny_programs import assert_loss_and_grads_match
from passkit.testing import assert_pattern_matches

B, H, S, E = 2, 4, 8, 16


def _qkv() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(B, H, S, E) for _ in range(3)]


def _attention_with_dropout(p: float, training: bool):
    def attention(q, k, v, mask):
        probs = (q @ k.transpose(-1, -2) * (1 / math.sqrt(E)) + mask).softmax(-1)
        return F.dropout(probs, p, training=training) @ v

    return attention


def _mask() -> torch.Tensor:
    return torch.zeros(B, 1, S, S).masked_fill(torch.rand(B, 1, S, S) > 0.7, -1e9)


@pytest.mark.parametrize(("p", "training"), [(0.0, True), (0.1, False)], ids=["p0-training", "p0.1-eval"])
def test_dropout_that_draws_nothing_is_rewritten(p, training) -> None:
    applied = assert_pattern_matches("attention", _attention_with_dropout(p, training), *_qkv(), _mask(), times=1)
    assert dict(applied.counts) == {"attention:mul_add": 1}


@pytest.mark.parametrize("passes", [("functionalize",), ("functionalize", "decompose")], ids=["aten", "core-aten"])
def test_active_dropout_is_left_alone(passes) -> None:
    with pytest.raises(pytest.fail.Exception, match="patterns applied 0 times"):
        assert_pattern_matches("attention", _attention_with_dropout(0.1, True), *_qkv(), _mask(), passes=passes)


@pytest.mark.slow
def test_gpt2_training_with_its_dropout_keeps_eagers_random_draws(tmp_path) -> None:
    transformers = require_module("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32)
    assert config.attn_pdrop == 0.1
    model = transformers.GPT2LMHeadModel(config).train()
    model.config._attn_implementation = "eager"

    class Logits(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.inner(input_ids=ids).logits

    eager, twin = Logits(model), Logits(copy.deepcopy(model))
    compiled = passkit.aot_module(twin, pipeline="training-python")
    ids = torch.randint(0, 128, (2, 12))
    compiled(ids)  # compile first: tracing draws nothing, but keep the seeds aligned below
    torch.manual_seed(1)
    out = compiled(ids)
    torch.manual_seed(1)
    expected = eager(ids)
    assert_loss_and_grads_match(out, expected, eager, twin)
    rewrite = next(r for r in compiled.passkit_reports[0].records if r.id == "attention")
    assert rewrite.stats["applied"] == {}
    assert not rewrite.changed
