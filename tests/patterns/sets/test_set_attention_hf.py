"""The attention set on Hugging Face models at attn_implementation="eager": matched, trained, equal."""

from __future__ import annotations

import copy

import pytest
import torch

import passkit
from dependencies import require_module
from tiny_programs import assert_loss_and_grads_match

transformers = require_module("transformers")


def _gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32)
    return transformers.GPT2LMHeadModel(config), "mul_add"


def _bert():
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=128
    )
    return transformers.BertModel(config, add_pooling_layer=False), "mul_add"


def _llama():
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=128,
    )
    return transformers.LlamaForCausalLM(config), "mul_add"


class _Logits(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.slow
@pytest.mark.parametrize("factory", [_gpt2, _bert, _llama], ids=["gpt2", "bert", "llama"])
def test_eager_attention_of_hf_models_becomes_sdpa_with_equal_numerics(factory, tmp_path) -> None:
    torch.manual_seed(0)
    model, expected_pattern = factory()
    model.config._attn_implementation = "eager"  # what attn_implementation="eager" sets
    model.eval()  # dropout off: compiled and eager draw different random numbers
    ids = torch.randint(0, 128, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0  # padding: a real attention mask reaches the scores
    pipeline = tmp_path / "attention.toml"
    pipeline.write_text(
        '[pipeline]\nname = "attention"\nextends = "training-python"\n\n[override.attention]\nexpect_match = true\n'
    )
    eager, twin = _Logits(model), _Logits(copy.deepcopy(model))
    compiled = passkit.aot_module(twin, pipeline=str(pipeline))
    out, expected = compiled(ids, mask), eager(ids, mask)
    assert_loss_and_grads_match(out, expected, eager, twin)
    rewrite = next(r for r in compiled.passkit_reports[0].records if r.id == "attention")
    assert rewrite.stats["applied"] == {f"attention:{expected_pattern}": 2}
