"""``codegen.inductor`` trains and infers like eager, validates its options, and fails in one line."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import passkit
from passkit.examples.convnet import ConvBN
from passkit.examples.transformer import MLP, Block

pytestmark = pytest.mark.slow  # every test here pays for Inductor compiling C++ kernels

TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}  # fused kernels sum in another order than ATen


MODELS = {
    "block": (lambda: Block(32, 4), lambda: torch.randn(2, 8, 32)),
    "mlp": (lambda: MLP(16, 32), lambda: torch.randn(4, 16)),
    "conv_bn": (ConvBN, lambda: torch.randn(2, 3, 8, 8)),
}


def _models(name: str) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    make_model, make_input = MODELS[name]
    torch.manual_seed(0)
    eager = make_model()
    return eager, copy.deepcopy(eager), make_input()


@pytest.mark.parametrize("name", list(MODELS))
def test_training_steps_match_eager(name: str) -> None:
    torch._dynamo.reset()
    eager, twin, x = _models(name)
    compiled = passkit.compile(twin, pipeline="training")
    for step in range(2):
        for model in (eager, twin):
            model.zero_grad(set_to_none=True)
        expected, actual = eager(x), compiled(x)
        torch.testing.assert_close(actual, expected, **TOLERANCE, msg=lambda m: f"step {step} output: {m}")
        (expected**2).mean().backward()
        (actual**2).mean().backward()
        for (pname, p_eager), p_twin in zip(eager.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p_twin.grad, p_eager.grad, **TOLERANCE, msg=lambda m: f"step {step} grad {pname}: {m}")
    for (bname, b_eager), b_twin in zip(eager.named_buffers(), twin.buffers()):
        torch.testing.assert_close(b_twin, b_eager, **TOLERANCE, msg=lambda m: f"buffer {bname}: {m}")
    (report,) = compiled.passkit_reports
    assert report.records[-1].pass_name == "codegen.inductor"
    # Inductor stores BatchNorm's new running statistics into the buffers itself (in the kernel
    # that computes them), as in torch.compile; the runtime copies nothing back.
    expected_written = 3 if name == "conv_bn" else None  # running mean, variance, count
    assert report.records[-1].stats.get("mutations_written_in_graph") == expected_written


# Inductor lowers dropout's `bernoulli.p` to a copy filled in place, and fused the layer norm's
# kernel with the readers of that copy before the fill ran: the output was norm x uninitialized
# memory (a NaN loss on BERT). Seeded alike, both draw ATen's masks (`fallback_random`).
def test_dropout_after_a_layer_norm_draws_eagers_mask() -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = nn.Sequential(nn.LayerNorm(32), nn.Dropout(0.1), nn.Linear(32, 8))
    twin = copy.deepcopy(eager)
    compiled = passkit.compile(twin, pipeline="training")
    x = torch.randn(4, 12, 32)
    for step in range(2):
        torch.manual_seed(step)
        expected = eager(x)
        torch.manual_seed(step)
        actual = compiled(x)
        torch.testing.assert_close(actual, expected, **TOLERANCE, msg=lambda m: f"step {step} output: {m}")
        expected.square().mean().backward()
        actual.square().mean().backward()
    for (pname, p_eager), p_twin in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p_twin.grad, p_eager.grad, **TOLERANCE, msg=lambda m: f"grad {pname}: {m}")


@pytest.mark.parametrize("name", list(MODELS))
def test_inference_matches_eager(name: str) -> None:
    torch._dynamo.reset()
    eager, twin, x = _models(name)
    eager.eval()
    twin.eval()
    compiled = passkit.compile(twin, pipeline="inference")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), eager(x), **TOLERANCE)
    (report,) = compiled.passkit_reports
    assert [r.pass_name for r in report.records][-1] == "codegen.inductor"
    assert "backward" not in compiled.passkit_backend.programs[0].compiled


def test_gradients_in_another_layout_than_traced_are_accepted() -> None:
    # ``sum().backward()`` hands the backward an expanded (stride 0) gradient; Inductor's code
    # asserts the traced strides, so the wrapper must copy it first.
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 8, requires_grad=True)
    compiled = passkit.aot_function(lambda a, b: (a @ b).tanh(), pipeline="training")
    compiled(x, w).sum().backward()
    x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    (x_ref @ w_ref).tanh().sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, **TOLERANCE)
    torch.testing.assert_close(w.grad, w_ref.grad, **TOLERANCE)


def test_input_mutations_and_views_are_written_back() -> None:
    def fn(x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state.mul_(0.5).add_(x.detach().mean())
        y = (x * state).sin()
        return y, y.view(-1)

    x, state = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    x_ref, state_ref = x.detach().clone().requires_grad_(), state.clone()
    out, flat = passkit.aot_function(fn, pipeline="training")(x, state)
    out_ref, flat_ref = fn(x_ref, state_ref)
    torch.testing.assert_close(state, state_ref, **TOLERANCE)
    torch.testing.assert_close(flat, flat_ref, **TOLERANCE)
    assert flat._base is out or flat._base is out._base
    (out * 2).sum().backward()
    (out_ref * 2).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, **TOLERANCE)


def test_a_missing_cxx_compiler_names_the_fallback_pipeline(tmp_path, monkeypatch) -> None:
    import torch._inductor.config as inductor_config

    # A fresh kernel cache, so the missing compiler is really needed.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    compiled = passkit.aot_function(lambda x: (x * 3).cos() + 1.25, pipeline="training", repro_dir=str(tmp_path / "repro"))
    no_compiler = {"fx_graph_cache": False, "cpp.cxx": (None, str(tmp_path / "no-such-c++"))}
    with inductor_config.patch(no_compiler), pytest.raises(passkit.PassError) as info:
        compiled(torch.randn(5, 7, requires_grad=True))
    message = str(info.value)
    assert "\n" not in message
    assert "InvalidCxxCompiler: No working C++ compiler found" in message
    training = passkit.load_pipeline("training")
    codegen = training.step("codegen.inductor")
    ran_before = ", ".join(s.id for s in training.steps[: codegen.position] if s.enabled)
    assert message.startswith(
        f"{training.where(codegen)} failed: PassError: Inductor cannot compile the 'forward' graph ("
    )
    assert message.endswith(
        "; use the 'training-python' pipeline, which needs no C++ compiler "
        f"(after: {ran_before}) (reproducer: {tmp_path / 'repro'}/{codegen.position + 1:02d}-codegen.inductor)"
    )


def test_options_are_validated(tmp_path) -> None:
    path = tmp_path / "fast.toml"
    path.write_text('[pipeline]\nname = "fast"\nextends = "training"\n\n[override."codegen.inductor"]\nmode = "fast"\n')
    with pytest.raises(passkit.PipelineError) as info:
        passkit.load_pipeline(str(path))
    assert str(info.value) == (
        f"{path}: override.\"codegen.inductor\".mode: Input should be 'default', 'reduce-overhead', 'max-autotune' "
        "or 'max-autotune-no-cudagraphs'"
    )


def test_the_inductor_table_leaves_out_decompositions_that_may_decline() -> None:
    from passkit import _torch

    aten = torch.ops.aten
    table, everything = _torch.inductor_decompositions(), _torch.inductor_all_decompositions()
    # mm (tiny shapes), amax and full (with a dtype) return NotImplemented for some inputs.
    for op in (aten.mm.default, aten.amax.default, aten.full.default):
        assert op in everything and op not in table
    assert aten.hardswish.default in table
