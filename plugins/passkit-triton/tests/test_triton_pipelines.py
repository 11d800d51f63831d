"""The shipped pipelines end to end: a training step of the d=64 block and of a tiny GPT-2.

Kernels run in Triton's interpreter; ``fast.toml`` turns autotuning off and picks large blocks
only to keep these tests short (autotuning is tested on its own in test_codegen.py).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import passkit
from passkit.examples.transformer import small_stack
from passkit_triton import codegen_triton, fuse_regions
from triton_helpers import require_module

require_module("triton")
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")


def fast(tmp_path: Path, base: str) -> Path:
    path = tmp_path / "fast.toml"
    # Large blocks: the interpreter runs a kernel's programs one after another.
    path.write_text(f'[pipeline]\nextends = "{base}"\n\n[override."codegen.triton"]\nautotune = false\nblock_sizes = [8192]\n')
    return path


def assert_grads_match(model: torch.nn.Module, eager: torch.nn.Module, *, rtol: float, atol: float) -> None:
    """Every parameter's gradient, by name: a gradient missing on either side fails."""
    ours, theirs = dict(model.named_parameters()), dict(eager.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, p in theirs.items():
        assert (ours[name].grad is None) == (p.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(ours[name].grad, p.grad, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def record(compiled, step: str):
    (found,) = [r for r in compiled.passkit_reports[0].records if r.id == step]
    return found


def test_shipped_pipelines_swap_the_codegen() -> None:
    for name, base in (("training-triton", "training-python"), ("inference-triton", "inference-python")):
        pipeline = passkit.load_pipeline(name)
        base_ids = [s.id for s in passkit.load_pipeline(base).steps]
        steps = {s.id: s for s in pipeline.steps}
        assert [s.id for s in pipeline.steps] == base_ids + ["fuse.regions", "codegen.triton"]
        assert steps["codegen.python"].enabled is False
        assert steps["decompose"].options.keep == []
        assert "aten._softmax.default" in steps["decompose"].options.extra


@pytest.mark.slow
def test_training_step_of_the_two_layer_block_matches_eager(tmp_path: Path, device: str) -> None:
    model, (x,) = small_stack()
    model, x = model.to(device), x.to(device)
    eager = copy.deepcopy(model)
    compiled = passkit.aot_module(model, pipeline=str(fast(tmp_path, "training-triton")))

    out = compiled(x)
    expected = eager(x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    cotangent = torch.randn_like(out)
    out.backward(cotangent)
    expected.backward(cotangent)
    assert_grads_match(model, eager, rtol=1e-4, atol=1e-4)
    fused = record(compiled, "fuse.regions").stats
    kernels = record(compiled, "codegen.triton").stats
    assert kernels == {"kernels": fused["regions"], "triton_kernels": kernels["triton_kernels"], "aten_regions": 0}
    assert 10 <= kernels["triton_kernels"] < kernels["kernels"]  # the two layers' regions share kernels
    assert fused["regions"] >= 20


def test_inference_of_the_block_matches_eager(tmp_path: Path, device: str) -> None:
    model, (x,) = small_stack()
    model, x = model.to(device), x.to(device)
    model.requires_grad_(False)
    compiled = passkit.aot_module(model, pipeline=str(fast(tmp_path, "inference-triton")))

    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    assert record(compiled, "codegen.triton").stats["kernels"] >= 8


@pytest.mark.slow
def test_training_step_of_a_transformers_gpt2_matches_eager(tmp_path: Path, device: str) -> None:
    transformers = require_module("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    torch.manual_seed(0)
    eager = transformers.GPT2LMHeadModel(config).train().to(device)
    eager.config._attn_implementation = "eager"
    twin = copy.deepcopy(eager)
    compiled = passkit.compile(twin, pipeline=str(fast(tmp_path, "training-triton")))
    ids = torch.randint(0, 64, (2, 8), device=device)

    actual = compiled(input_ids=ids, labels=ids)
    expected = eager(input_ids=ids, labels=ids)
    torch.testing.assert_close(actual.logits, expected.logits, rtol=1e-4, atol=1e-5)
    actual.loss.backward()
    expected.loss.backward()
    assert_grads_match(twin, eager, rtol=1e-4, atol=1e-5)
    assert record(compiled, "codegen.triton").stats["kernels"] >= 10


def test_symbolic_sizes_are_kernel_arguments(device: str) -> None:
    """One compiled program serves every batch and row length: sizes are read at run time."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        centered = x - x.mean(-1, keepdim=True)
        return torch.softmax(centered * w, dim=-1)

    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(4, 6, 10, device=device), torch.randn(10, device=device))
    program = passkit.Program(graphs={"main": gm}, signature=None, example_inputs=[], facts={"functional"})
    fuse_regions(program)
    codegen_triton(program, autotune=False)
    (region,) = [n.meta["fusion_region"] for n in gm.graph.nodes if n.op == "call_module"]
    assert len(region["domain"]) == 3 and not any(size.isdigit() for size in region["domain"])

    for shape in ((4, 6, 10), (2, 3, 17), (1, 1, 1), (5, 2, 64)):
        x, w = torch.randn(shape, device=device), torch.randn(shape[-1], device=device)
        out = program.compiled["main"](x, w)
        out = out[0] if isinstance(out, (tuple, list)) else out
        torch.testing.assert_close(out, fn(x, w), rtol=1e-5, atol=1e-6)


def test_codegen_without_fusion_is_refused_when_the_file_loads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nofuse.toml").write_text(
        '[pipeline]\nextends = "inference-python"\ndisable = ["codegen.python"]\n\n[[steps]]\npass = "codegen.triton"\n'
    )
    with pytest.raises(passkit.PipelineError) as raised:
        passkit.load_pipeline("nofuse.toml")
    assert str(raised.value) == (
        "nofuse.toml: steps[0] (codegen.triton): requires fact 'fused', which no earlier step produces; "
        "add a 'fuse.regions' step before it"
    )
