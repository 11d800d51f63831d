"""The models the export tests deploy, each at its defaults, with the inputs it is exported on and
the inputs it is checked on afterwards (another batch size where the export is dynamic)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class Deployed:
    """A model to export: how to build it, what to export it with, what to check it on."""

    build: Callable[[], torch.nn.Module]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    dynamic_shapes: Any = None
    checks: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=1, n_head=4)).eval()


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, num_attention_heads=4, intermediate_size=64,
                                        num_hidden_layers=1, num_key_value_heads=2, max_position_embeddings=32)).eval()


class ConvBN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.conv(x)).relu().mean((2, 3)))


def _bn_eval() -> torch.nn.Module:
    model = ConvBN().eval()
    with torch.no_grad():  # statistics that are not the identity, so eval mode reads them
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
    return model


def _bn_train() -> torch.nn.Module:
    return ConvBN().train()


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@torch.library.custom_op("passkit_test::scaled_add", mutates_args=())
def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x + alpha * y


@scaled_add.register_fake
def _scaled_add_fake(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.empty_like(x)


class WithCustomOp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scaled_add(self.lin(x), x, 0.5).relu()


def _ids(batch: int) -> torch.Tensor:
    return torch.randint(0, 96, (batch, 12), generator=torch.Generator().manual_seed(batch))


def _images(batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, 8, 8, generator=torch.Generator().manual_seed(batch))


def _rows(batch: int) -> torch.Tensor:
    return torch.randn(batch, 8, generator=torch.Generator().manual_seed(batch))


MODELS: dict[str, Deployed] = {
    "gpt2": Deployed(_gpt2, kwargs={"input_ids": _ids(2), "use_cache": False},
                     checks=[((), {"input_ids": _ids(2), "use_cache": False})]),
    "llama": Deployed(_llama, kwargs={"input_ids": _ids(2), "use_cache": False},
                      checks=[((), {"input_ids": _ids(2), "use_cache": False})]),
    "batchnorm_eval": Deployed(_bn_eval, args=(_images(4),), checks=[((_images(4),), {})]),
    "batchnorm_train": Deployed(_bn_train, args=(_images(4),), checks=[((_images(4),), {})]),
    "dynamic_batch": Deployed(MLP, args=(_rows(4),), dynamic_shapes=({0: torch.export.Dim("batch")},),
                              checks=[((_rows(4),), {}), ((_rows(7),), {}), ((_rows(3),), {})]),
    "custom_op": Deployed(WithCustomOp, args=(_rows(4),), checks=[((_rows(4),), {})]),
}


def leaves(out: Any) -> Any:
    """A model's outputs as plain tensors (Hugging Face's output classes flattened)."""
    return tuple(torch.utils._pytree.tree_leaves(out))
