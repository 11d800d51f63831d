"""benchmarks/triton_gpu.py, the parts that run without a GPU: how it pairs a step's tensors,
and that its GPT-2 is the one the issue asks for (dropout on, GPT-2's vocabulary)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch
from triton_helpers import require_module

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "triton_gpu.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("triton_gpu_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def a_step(**grads: torch.Tensor | None) -> tuple[list[torch.Tensor], dict[str, torch.Tensor | None]]:
    return [torch.ones(2)], dict(grads)


def test_gradients_are_paired_by_name(bench) -> None:
    w, b = torch.ones(3), torch.zeros(3)
    pairs = bench.paired(a_step(w=w, b=b), a_step(b=b + 1, w=w + 1))
    assert [(label, float(ours.sum()), float(theirs.sum())) for label, ours, theirs in pairs] == [
        ("output 0", 2.0, 2.0), ("grad b", 0.0, 3.0), ("grad w", 3.0, 6.0)
    ]


def test_a_dropped_gradient_fails(bench) -> None:
    w = torch.ones(3)
    with pytest.raises(AssertionError) as raised:
        bench.paired(a_step(w=None, b=w), a_step(w=w, b=w))
    assert str(raised.value) == "gradient of w: missing"
    with pytest.raises(AssertionError) as raised:
        bench.paired(a_step(b=w), a_step(w=w, b=w))
    assert str(raised.value) == "parameters differ: ['w']"


@pytest.mark.slow  # importing transformers
def test_its_gpt2_has_dropout_and_gpt2s_vocabulary(bench, monkeypatch) -> None:
    require_module("transformers")
    monkeypatch.setattr(bench, "DEVICE", "cpu")  # the smoke run's size: the same config otherwise
    model, (ids,) = bench.gpt2()
    config = model.lm.config
    assert (config.vocab_size, config.resid_pdrop, config.embd_pdrop, config.attn_pdrop) == (50257, 0.1, 0.1, 0.1)
    assert model.training and ids.max() < 50257
