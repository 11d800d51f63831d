"""Symbolic sizes flow through every built-in pass, the runtime wrapper and verify.

``torch.compile(backend="passkit")`` at its default ``dynamic=None`` compiles a varying batch
twice (static, then symbolic) and reuses the symbolic program; ``dynamic=True`` is symbolic
from the first call.
"""

from __future__ import annotations

import copy
import math

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
    assert ran == ["functionalize", "decompose", "attention", "joint", "partition.torch_min_cut", "collectives.reshard",
                   "fx.cse", "fx.dce", "collectives.bucket", "collectives.overlap", "codegen.python"]


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


class _TanhGeluMLP(nn.Module):
    """GPT-2's MLP: Hugging Face's ``NewGELUActivation`` written out (it reads ``math.pi``), or
    torch's tanh GELU."""

    def __init__(self, written_out: bool) -> None:
        super().__init__()
        self.fc, self.proj, self.written_out = nn.Linear(16, 32), nn.Linear(32, 16), written_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.written_out:
            h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        else:
            h = torch.nn.functional.gelu(h, approximate="tanh")
        return x + self.proj(h)


@pytest.mark.parametrize(
    "pipeline", ["training-python", pytest.param("training", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("written_out", [True, False], ids=["new_gelu", "gelu_tanh"])
def test_a_tanh_gelu_trains_under_dynamic_true_with_one_compile(pipeline: str, written_out: bool) -> None:
    """Dynamo passes ``math.pi`` as a float input; every batch size runs the one program."""
    torch.manual_seed(0)
    model = _TanhGeluMLP(written_out)
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="passkit", options={"pipeline": pipeline}, dynamic=True)
    before = len(passkit.reports())
    for batch in (3, 5):
        x = torch.randn(batch, 4, 16)
        expected, actual = model(x), compiled(x)
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
        expected.square().mean().backward()
        actual.square().mean().backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-5)
            p.grad = q.grad = None
    assert [r.graph.split(", ")[1] for r in passkit.reports()[before:]] == ["training"]


def test_a_float_argument_is_read_as_its_value_and_another_value_recompiles() -> None:
    """A float Dynamo leaves symbolic is specialized under a guard: a new value is never
    computed with the old one."""

    def scaled(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.tanh(x * scale) * (scale + 1.0)

    compiled = torch.compile(scaled, backend="passkit", options={"pipeline": "training-python"}, dynamic=True)
    before = len(passkit.reports())
    for scale, batch in ((0.5, 3), (0.5, 5), (0.75, 5)):
        x = torch.randn(batch, 4, requires_grad=True)
        out = compiled(x, scale)
        torch.testing.assert_close(out, scaled(x, scale))
        (grad,) = torch.autograd.grad(out.sum(), x)
        torch.testing.assert_close(grad, torch.autograd.grad(scaled(x, scale).sum(), x)[0])
    assert len(passkit.reports()) - before == 2  # one program per value of scale, not per batch


def _slice_of_input(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (x[1:],)


def _transpose_and_product(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (x.t(), x * 2)


def _view_of_an_output(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * 2
    return (y, y[1:])


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("fn", [_slice_of_input, _transpose_and_product, _view_of_an_output])
def test_a_view_returned_with_symbolic_sizes_has_each_calls_geometry(fn, grad: bool) -> None:
    # Found by ``passkit fuzz``: the view's recorded geometry held symbols, and functionalize
    # failed copying the program ("Cannot access data pointer of Tensor").
    for backend in ("aot_eager", passkit.backend("training-python", cache="off")):
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=backend, dynamic=True)
        for rows in (4, 6):
            x = torch.randn(rows, 4, requires_grad=grad)
            y = x.detach().clone().requires_grad_(grad)
            actual, expected = compiled(x), fn(y)
            for a, e in zip(actual, expected):
                torch.testing.assert_close(a, e, rtol=0, atol=0)
                assert (a.stride(), a.storage_offset(), a.requires_grad) == (e.stride(), e.storage_offset(), e.requires_grad)
                shares = a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
                assert shares == (e.untyped_storage().data_ptr() == y.untyped_storage().data_ptr())
            if grad:
                sum((a * 1.5).sum() for a in actual).backward()
                sum((e * 1.5).sum() for e in expected).backward()
                torch.testing.assert_close(x.grad, y.grad)
