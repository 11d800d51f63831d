"""The progress lines name the user's code, not torch's or a library's wrapper around it: an
``nn.Sequential`` is ``Sequential.forward`` (not ``wrap_inline.<locals>.inner``), a Hugging Face
model is its class's ``forward`` (not ``deprecate_kwarg``'s ``wrapped_func``), and a wrapper's
``args[i]`` inputs are named by the wrapped forward's parameters."""

from __future__ import annotations

import inspect
import logging
import os
import re

import pytest
import torch

import passkit
from dependencies import require_module

pytestmark = pytest.mark.slow  # three compiles through Dynamo


def scaled(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2


def _lines(model: object, *inputs: torch.Tensor, caplog: pytest.LogCaptureFixture) -> list[str]:
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=passkit.backend("training-python"))
    with caplog.at_level(logging.INFO, logger="passkit"):
        compiled(*inputs)
    found = [r.getMessage() for r in caplog.records if r.name == "passkit"]
    found = [line for line in found if line.startswith(("Dynamo is tracing", "compiling graph"))]
    return [re.sub(r"\(Dynamo frame \d+/0\)", "(Dynamo frame N/0)", line) for line in found]


def _at(fn: object) -> str:
    code = inspect.unwrap(fn).__code__  # type: ignore[arg-type]
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def test_an_nn_sequential_is_named_by_its_forward(caplog: pytest.LogCaptureFixture) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    where = f"Sequential.forward at {_at(torch.nn.Sequential.forward)}"
    assert where == "Sequential.forward at container.py:" + where.rsplit(":", 1)[1]
    assert _lines(model, torch.randn(3, 4), caplog=caplog) == [
        f"Dynamo is tracing {where} (Dynamo frame N/0)",
        f"compiling graph 1: {where} (Dynamo frame N/0), inputs input float32[3, 4]",
    ]


def test_a_plain_function_is_named_by_itself(caplog: pytest.LogCaptureFixture) -> None:
    where = f"scaled at test_recompiles_user_code.py:{scaled.__code__.co_firstlineno}"
    assert _lines(scaled, torch.randn(5, requires_grad=True), caplog=caplog) == [
        f"Dynamo is tracing {where} (Dynamo frame N/0)",
        f"compiling graph 1: {where} (Dynamo frame N/0), inputs x float32[5]",
    ]


def test_a_hugging_face_model_is_named_by_its_class_forward_not_its_wrapper(caplog: pytest.LogCaptureFixture) -> None:
    transformers = require_module("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    where = f"LlamaForCausalLM.forward at {_at(transformers.LlamaForCausalLM.forward)}"
    assert where.startswith("LlamaForCausalLM.forward at modeling_llama.py:")
    lines = _lines(model, torch.randint(0, 64, (1, 8)), caplog=caplog)
    assert lines[:2] == [
        f"Dynamo is tracing {where} (Dynamo frame N/0)",
        f"compiling graph 1: {where} (Dynamo frame N/0), inputs input_ids int64[1, 8]",
    ]
    assert not any("wrapped_func" in line or "wrap_inline" in line for line in lines)
