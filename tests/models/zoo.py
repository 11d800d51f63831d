"""Small random-init Hugging Face models at their default settings, with example inputs.

Shared by ``tests/models/test_model_zoo.py`` and ``benchmarks/model_zoo.py``. Only sizes are
made small; every other setting (attention implementation, dropout, activation) is the
config's default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

TEXT = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, intermediate_size=64)


@dataclass(frozen=True)
class ZooModel:
    name: str
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int], dict[str, Any]]


def _ids(batch: int, seq: int = 12, vocab: int = 96) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq))


def _causal_lm(batch: int) -> dict[str, Any]:
    ids = _ids(batch)
    return {"input_ids": ids, "labels": ids}


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=1, n_head=4))


def _bert() -> torch.nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(**TEXT, num_hidden_layers=1, max_position_embeddings=32))


def _bert_inputs(batch: int) -> dict[str, Any]:
    ids = _ids(batch)
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # padding: a real attention mask
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(**TEXT, num_hidden_layers=1, num_key_value_heads=2, max_position_embeddings=32)
    )


def _qwen2() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(
        Qwen2Config(**TEXT, num_hidden_layers=1, num_key_value_heads=2, max_position_embeddings=32)
    )


def _t5() -> torch.nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    return T5ForConditionalGeneration(
        T5Config(vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4, decoder_start_token_id=0)
    )


def _t5_inputs(batch: int) -> dict[str, Any]:
    return {"input_ids": _ids(batch), "labels": _ids(batch, seq=6)}


def _vit() -> torch.nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(
        ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                  image_size=16, patch_size=4, num_labels=5)
    )


def _image_inputs(batch: int, size: int = 16) -> dict[str, Any]:
    return {"pixel_values": torch.randn(batch, 3, size, size), "labels": torch.randint(0, 5, (batch,))}


def _resnet() -> torch.nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    return ResNetForImageClassification(
        ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5)
    )


def _convnext() -> torch.nn.Module:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    return ConvNextForImageClassification(
        ConvNextConfig(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], num_labels=5, image_size=32)
    )


def _image32(batch: int) -> dict[str, Any]:
    return _image_inputs(batch, 32)


ZOO = [
    ZooModel("gpt2", _gpt2, _causal_lm),
    ZooModel("bert", _bert, _bert_inputs),
    ZooModel("llama", _llama, _causal_lm),
    ZooModel("t5", _t5, _t5_inputs),
    ZooModel("qwen2", _qwen2, _causal_lm),
    ZooModel("vit", _vit, _image_inputs),
    ZooModel("resnet", _resnet, _image32),
    ZooModel("convnext", _convnext, _image32),
]


def gpt2_ids() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """``--model zoo:gpt2_ids`` for the CLI: the zoo's GPT-2 (training mode, dropout on, as at
    its defaults) and a batch of 4 token-id rows; the outputs are the logits."""
    torch.manual_seed(0)
    model = _gpt2()
    return model, (_ids(4),)
