"""functorch transforms, activation checkpointing, and a model from a library nobody here wrote."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, jacrev, vmap
from torch.utils.checkpoint import CheckpointPolicy, checkpoint

import passkit

from training_harness import ENTRIES, assert_compiled, compiled_with


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


@pytest.mark.parametrize("entry", ENTRIES)
def test_per_sample_gradients_with_vmap_of_grad(entry: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x, y):
        return ((functional_call(model, p, (x.unsqueeze(0),)) - y) ** 2).mean()

    def per_sample(p, x, y):
        return vmap(grad(loss), in_dims=(None, 0, 0))(p, x, y)

    x, y = torch.randn(6, 5), torch.randn(6, 1)
    expected = per_sample(params, x, y)
    compiled = compiled_with(entry, per_sample)
    actual = compiled(params, x, y)
    assert expected.keys() == actual.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-5, atol=1e-6)
    assert_compiled(compiled)


@pytest.mark.parametrize("entry", ENTRIES)
def test_jacobian_with_jacrev(entry: str) -> None:
    def jacobian(w, x):
        return jacrev(lambda v: (w @ v).sin())(x)

    torch.manual_seed(0)
    w, x = torch.randn(3, 4), torch.randn(4)
    compiled = compiled_with(entry, jacobian)
    torch.testing.assert_close(compiled(w, x), jacobian(w, x))
    assert_compiled(compiled)


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(16, 64)
        self.outer = nn.Linear(64, 16)

    def region(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(self.inner(x).relu().sin())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.region, x, use_reentrant=False).cos()


def _train_once(module: nn.Module, runner, x: torch.Tensor) -> torch.Tensor:
    out = runner(x)
    (out**2).sum().backward()
    return out


@pytest.mark.parametrize("pipeline", ["training-python", "torch-min-cut"])
def test_checkpointed_model_gradients_match_eager(pipeline: str, tmp_path) -> None:
    torch.manual_seed(0)
    eager = Checkpointed()
    twin = copy.deepcopy(eager)
    if pipeline == "torch-min-cut":
        path = tmp_path / "min_cut.toml"
        path.write_text('[pipeline]\nname = "min-cut"\nextends = "training-python"\n\n[override."partition.default"]\nenabled = false\n\n'
                        '[[steps]]\npass = "partition.torch_min_cut"\nafter = "partition.default"\n')
        pipeline = str(path)
    compiled = passkit.compile(twin, pipeline=pipeline)
    x = torch.randn(4, 16)
    torch.testing.assert_close(_train_once(twin, compiled, x), _train_once(eager, eager, x))
    for p_eager, p_twin in zip(eager.parameters(), twin.parameters()):
        torch.testing.assert_close(p_twin.grad, p_eager.grad)
    assert_compiled(compiled)


def test_recompute_tags_reach_the_partitioner_and_min_cut_honours_them(tmp_path) -> None:
    torch.manual_seed(0)
    model = Checkpointed()
    path = tmp_path / "min_cut.toml"
    path.write_text('[pipeline]\nname = "min-cut"\nextends = "training-python"\n\n[override."partition.default"]\nenabled = false\n\n'
                    '[[steps]]\npass = "partition.torch_min_cut"\nafter = "partition.default"\n')
    x = torch.randn(4, 16)
    saved = {}
    for name, pipeline in (("default", "training-python"), ("min_cut", str(path))):
        torch._dynamo.reset()
        compiled = passkit.compile(copy.deepcopy(model), pipeline=pipeline)
        _train_once(model, compiled, x)
        (program,) = compiled.passkit_backend.programs
        tags = {n.meta.get("recompute") for n in program.graphs["forward"].graph.nodes}
        assert CheckpointPolicy.PREFER_RECOMPUTE in tags, f"{name}: no recompute tags in the forward graph"
        (report,) = compiled.passkit_reports
        saved[name] = next(r.stats["activation_bytes"] for r in report.records if r.id.startswith("partition") and r.status == "ran")
    # The checkpointed region's activations are recomputed, not saved: only inputs stay alive.
    assert saved["min_cut"] == 0 < saved["default"]


def test_a_transformers_gpt2_model_trains_like_eager() -> None:
    import transformers  # in the dev extra: a missing install must fail, not skip
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    eager = transformers.GPT2LMHeadModel(config).train()
    eager.config._attn_implementation = "eager"
    twin = copy.deepcopy(eager)
    compiled = passkit.compile(twin, pipeline="training-python")
    ids = torch.randint(0, 64, (2, 8))
    expected = eager(input_ids=ids, labels=ids)
    actual = compiled(input_ids=ids, labels=ids)
    torch.testing.assert_close(actual.logits, expected.logits, rtol=1e-5, atol=1e-5)
    expected.loss.backward()
    actual.loss.backward()
    for (name, p_eager), p_twin in zip(eager.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p_twin.grad, p_eager.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    assert_compiled(compiled)
