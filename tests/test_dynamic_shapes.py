"""Symbolic sizes flow through every built-in pass, the runtime wrapper and verify.

``torch.compile(backend="passkit")`` at its default ``dynamic=None`` compiles a varying batch
twice (static, then symbolic) and reuses the symbolic program; ``dynamic=True`` is symbolic
from the first call.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import passkit
from passkit.examples.transformer import Block

MIN_CUT_LOWER_ALL = """
[pipeline]
name = "min-cut-lower-all"
extends = "training-python"
disable = ["partition.default"]

[settings]
verify = "{verify}"

[override.decompose]
keep = []

[[steps]]
pass = "partition.torch_min_cut"
after = "joint"
"""


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


def _pipeline(tmp_path, verify: str) -> str:
    path = tmp_path / "p.toml"
    path.write_text(MIN_CUT_LOWER_ALL.format(verify=verify))
    return str(path)


def _assert_steps_match_eager(model: nn.Module, compiled: nn.Module, batches: list[int], seq: int = 8) -> None:
    twin_params = list(compiled.parameters()) if isinstance(compiled, nn.Module) else None
    for b in batches:
        x = torch.randn(b, seq, 32)
        expected = model(x)
        actual = compiled(x)
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5, msg=lambda m: f"batch {b}: {m}")
        expected.square().mean().backward()
        actual.square().mean().backward()
        for (name, p), q in zip(model.named_parameters(), twin_params):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"batch {b} grad {name}: {m}")
            p.grad = q.grad = None
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def _block_pair() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = Block(32, 4)
    return model, copy.deepcopy(model)


def test_default_dynamic_compiles_static_then_symbolic_then_reuses() -> None:
    model, twin = _block_pair()
    compiled = torch.compile(twin, backend="passkit")
    before = len(passkit.reports())
    _assert_steps_match_eager(model, compiled, [2, 3, 4, 5, 3])
    kinds = [r.graph.split(", ")[1] for r in passkit.reports()[before:]]
    assert kinds == ["training", "inference", "training", "inference"]


def test_dynamic_true_is_symbolic_from_the_first_call() -> None:
    model, twin = _block_pair()
    compiled = passkit.compile(twin, pipeline="training-python", dynamic=True)
    _assert_steps_match_eager(model, compiled, [2, 5, 3])
    assert len(compiled.passkit_reports) == 2  # one training, one inference program


@pytest.mark.parametrize("verify", ["facts", "numerics"])
def test_symbolic_sizes_through_min_cut_full_decomposition_and_verify(tmp_path, verify: str) -> None:
    model, twin = _block_pair()
    compiled = passkit.compile(twin, pipeline=_pipeline(tmp_path, verify), dynamic=True)
    _assert_steps_match_eager(model, compiled, [3, 2])
    report = compiled.passkit_reports[0]
    ran = [r.id for r in report.records if r.status == "ran"]
    assert ran == ["functionalize", "decompose", "attention", "joint", "partition.torch_min_cut", "fx.cse", "fx.dce", "codegen.python"]


def test_a_size_passed_as_an_argument_is_a_graph_input() -> None:
    def fn(x: torch.Tensor, n: int) -> torch.Tensor:
        return x.reshape(n, -1).sum(0) * n

    compiled = passkit.compile(fn, pipeline="training-python", dynamic=True)
    for n in (2, 4, 8):
        x = torch.randn(8, 2, requires_grad=True)
        torch.testing.assert_close(compiled(x, n), fn(x, n))
        compiled(x, n).sum().backward()
        torch.testing.assert_close(x.grad, torch.full((8, 2), float(n)))
    # Dynamo specialises a plain int on its first value, then makes it a symbol.
    assert len(compiled.passkit_reports) == 2
    symbolic = compiled.passkit_backend.programs[-1]
    assert any(not info.is_tensor for info in symbolic.signature.inputs)  # SymInt inputs


class _SdpaBlock(nn.Module):
    """Attention as Hugging Face writes it: (B, T, H, D) views transposed into SDPA."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(32, 96), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (y.view(b, t, 4, 8).transpose(1, 2) for y in self.qkv(x).chunk(3, dim=-1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


def test_symbolic_sizes_through_a_lowered_sdpa(tmp_path) -> None:
    torch.manual_seed(0)
    model = _SdpaBlock()
    twin = copy.deepcopy(model)
    compiled = passkit.compile(twin, pipeline=_pipeline(tmp_path, "facts"), dynamic=True)
    _assert_steps_match_eager(model, compiled, [3, 2, 4])
    assert len(compiled.passkit_reports) == 2
