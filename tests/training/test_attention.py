"""Every attention form torch and transformers produce by default trains and infers as eager.

The forms: ``F.scaled_dot_product_attention`` with and without ``is_causal``, a boolean or an
additive mask, dropout, grouped-query heads; queries laid out as (B, T, H, D) transposed (what
every Hugging Face model passes) or contiguous; the CPU flash and math ops called directly; and
the hand-written ("eager") attention. Each runs through the shipped pipeline and through one
whose ``decompose`` lowers the fused ops too (``keep`` empty), where torch's decomposition of
the CPU flash op returns a layout the captured ``view`` nodes do not expect.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import passkit


LOWER_ALL = """
[pipeline]
name = "lower-all"
extends = "training-python"

[override.decompose]
keep = []
"""


def compiled_module(module: nn.Module, pipeline: str) -> nn.Module:
    torch._dynamo.reset()
    return passkit.compile(module, pipeline=pipeline)


def _q(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, c = x.shape
    return x.view(b, t, heads, c // heads).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, form: str, *, heads: int = 4, kv_heads: int = 4, dim: int = 32, dropout: float = 0.0) -> None:
        super().__init__()
        self.form, self.heads, self.kv_heads, self.dropout = form, heads, kv_heads, dropout
        head_dim = dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * head_dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, c = x.shape
        q = _q(self.q(x), self.heads)
        k, v = (_q(y, self.kv_heads) for y in self.kv(x).chunk(2, dim=-1))
        if self.form == "contiguous":
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        p = self.dropout if self.training else 0.0
        if self.form in ("sdpa", "contiguous"):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, enable_gqa=self.heads != self.kv_heads)
        elif self.form == "causal":
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        elif self.form == "flash_cpu":
            y = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[0]
        elif self.form == "math":
            y = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=mask, dropout_p=p)[0]
        else:  # eager attention, as transformers writes it
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            if mask is not None:
                scores = scores + mask if mask.is_floating_point() else scores.masked_fill(~mask, float("-inf"))
            y = F.dropout(scores.softmax(-1), p, self.training) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, c))


def _mask(kind: str, t: int = 8) -> torch.Tensor | None:
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    if kind == "bool":
        return causal
    if kind == "float":
        return torch.zeros(t, t).masked_fill(~causal, float("-inf"))
    return None


CASES = [
    ("sdpa", {}, None),
    ("sdpa", {}, "bool"),
    ("sdpa", {}, "float"),
    ("sdpa", {"kv_heads": 2}, None),
    ("contiguous", {}, "bool"),
    ("causal", {}, None),
    ("flash_cpu", {}, None),
    ("math", {}, "float"),
    ("eager", {}, "bool"),
    ("eager", {}, "float"),
]


def _ids(case: tuple) -> str:
    form, kwargs, mask = case
    return "-".join([form, *(f"{k}{v}" for k, v in kwargs.items()), mask or "nomask"])


def _pipeline(name: str, tmp_path) -> str:
    if name == "training-python":
        return name
    path = tmp_path / "lower-all.toml"
    path.write_text(LOWER_ALL)
    return str(path)


def _step(model: nn.Module, runner: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    out = runner(x.clone(), mask)
    (out * torch.linspace(0.5, 1.5, out.numel()).view(out.shape)).sum().backward()
    return out.detach()


@pytest.mark.parametrize("pipeline", ["training-python", "lower-all"])
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_attention_trains_and_infers_like_eager(case: tuple, pipeline: str, tmp_path) -> None:
    form, kwargs, mask_kind = case
    torch.manual_seed(0)
    eager = Attention(form, **kwargs)
    twin = copy.deepcopy(eager)
    compiled = compiled_module(twin, pipeline=_pipeline(pipeline, tmp_path))
    x, mask = torch.randn(2, 8, 32), _mask(mask_kind)
    expected = _step(eager, eager, x, mask, 1)
    actual = _step(twin, compiled, x, mask, 1)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    for (name, p_e), p_a in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p_a.grad, p_e.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"grad {name}: {m}")
    eager.eval(), twin.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, mask), eager(x, mask), rtol=1e-5, atol=1e-5)
    assert [r.status for r in compiled.passkit_reports[-1].records].count("ran") >= 4


@pytest.mark.parametrize("form", ["sdpa", "causal", "eager"])
def test_attention_dropout_draws_the_same_mask_as_eager(form: str) -> None:
    torch.manual_seed(0)
    eager = Attention(form, dropout=0.3)
    twin = copy.deepcopy(eager)
    compiled = compiled_module(twin, pipeline="training-python")
    x = torch.randn(2, 8, 32)
    expected = _step(eager, eager, x, None, 7)
    actual = _step(twin, compiled, x, None, 7)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    for (name, p_e), p_a in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p_a.grad, p_e.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"grad {name}: {m}")


def test_aot_module_lowers_sdpa_with_transposed_queries(tmp_path) -> None:
    torch.manual_seed(0)
    model = Attention("causal")
    compiled = passkit.aot_module(copy.deepcopy(model), pipeline=_pipeline("lower-all", tmp_path))
    x = torch.randn(2, 8, 32)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_the_python_pipeline_keeps_the_cpu_flash_attention_whole() -> None:
    torch.manual_seed(0)
    model = Attention("causal")
    compiled = compiled_module(copy.deepcopy(model), pipeline="training-python")
    compiled(torch.randn(2, 8, 32)).sum().backward()
    program = compiled.passkit_backend.programs[0]
    ops = {str(n.target) for gm in program.graphs.values() for n in gm.graph.nodes}
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in ops
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward.default" in ops
