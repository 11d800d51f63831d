"""The ``regions`` pass: repeated layers found without annotation, outlined once, exact to eager."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

import passkit
from passkit.examples import transformer
from tiny_programs import REGIONS_PYTHON, regions_overlay

OVERLAY = REGIONS_PYTHON

WITHOUT = """
[pipeline]
name = "no-regions"
extends = "regions-python"
disable = ["regions"]
"""

# `training`, whose step is on; the tests below name it as they named the overlay before.
TRAINING = regions_overlay("training", "training-regions")


def _pipeline(tmp_path: Path, text: str = OVERLAY) -> str:
    (tmp_path / "regions-python.toml").write_text(OVERLAY)
    path = tmp_path / "pipeline.toml"
    path.write_text(text.replace('extends = "regions-python"', 'extends = "regions-python.toml"'))
    return str(path)


class DropoutBlock(nn.Module):
    """The acceptance block with dropout after attention and the MLP (p=0.1, as GPT-2's)."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.block = transformer.Block(dim, 4)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.block(x))


class Stack(nn.Module):
    def __init__(self, layers: int, dim: int = 32) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DropoutBlock(dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class EncoderDecoder(nn.Module):
    """Two layer kinds: torch's encoder and decoder layers (dropout 0.1), three of each."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.model = nn.Transformer(dim, 4, 3, 3, dim_feedforward=64, batch_first=True)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.model(src, tgt)


class GPT2Logits(nn.Module):
    def __init__(self, dropout: float = 0.1) -> None:
        super().__init__()
        import transformers

        config = transformers.GPT2Config(
            n_layer=3, n_head=4, n_embd=32, vocab_size=100, n_positions=32,
            attn_pdrop=dropout, resid_pdrop=dropout, embd_pdrop=dropout,
        )
        self.model = transformers.GPT2LMHeadModel(config).train()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids).logits


def _step(model: nn.Module, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(1234)
    out = model(*inputs)
    (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum().backward()
    return out.detach(), [p.grad for p in model.parameters() if p.grad is not None]


def _compare(factory: Callable[[], nn.Module], inputs: list[torch.Tensor], pipeline: str) -> Any:
    torch.manual_seed(0)
    eager = factory()
    twin = copy.deepcopy(eager)
    compiled = passkit.compile(twin, pipeline=pipeline, cache="off")
    out, grads = _step(compiled, inputs)
    expected, expected_grads = _step(eager, inputs)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert len(grads) == len(expected_grads)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
    return compiled.passkit_reports[0].records[0]


@pytest.mark.slow
def test_block_stack_with_dropout_is_exact_and_one_region_repeats(tmp_path: Path) -> None:
    record = _compare(lambda: Stack(4), [torch.randn(2, 16, 32)], _pipeline(tmp_path))
    assert record.id == "regions"
    # The first layer reads an input that needs no grad, and shares the others' body all the same.
    assert record.stats["regions"] == 1
    assert record.stats["repeats"] == {"layers.* (DropoutBlock, 31 nodes)": 4}


@pytest.mark.slow
def test_two_layers_per_region_make_one_body_of_each_pair_and_stay_exact(tmp_path: Path) -> None:
    # Five layers: two pairs share a body; the fifth, alone of its kind, stays inline.
    text = OVERLAY + "layers_per_region = 2\n"
    record = _compare(lambda: Stack(5), [torch.randn(2, 16, 32)], _pipeline(tmp_path, text.replace(
        'name = "regions-python"', 'name = "pairs"')))
    assert record.stats["repeats"] == {"layers.* (DropoutBlock x2, 62 nodes)": 2}


def test_layers_per_region_below_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "zero.toml"
    path.write_text(OVERLAY.replace('name = "regions-python"', 'name = "zero"') + "layers_per_region = 0\n")
    with pytest.raises(passkit.PipelineError) as raised:
        passkit.load_pipeline(str(path))
    assert str(raised.value) == f"{path}: steps[0] (regions).layers_per_region: Input should be greater than or equal to 1"


@pytest.mark.slow
def test_encoder_decoder_outlines_both_layer_kinds_exactly(tmp_path: Path) -> None:
    record = _compare(EncoderDecoder, [torch.randn(2, 8, 32), torch.randn(2, 6, 32)], _pipeline(tmp_path))
    assert record.stats["regions"] == 2
    assert sorted(record.stats["repeats"].values()) == [2, 2]


@pytest.mark.slow
def test_gpt2_is_exact_with_its_blocks_outlined(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    record = _compare(GPT2Logits, [torch.randint(0, 100, (2, 16))], _pipeline(tmp_path))
    assert record.stats["regions"] == 1
    assert list(record.stats["repeats"].values()) == [3]


@pytest.mark.slow
def test_training_with_regions_on_is_exact_with_inductor(tmp_path: Path) -> None:
    record = _compare(lambda: transformer.TransformerStack(3, 32, 4), [torch.randn(2, 8, 32)], _pipeline(tmp_path, TRAINING))
    assert record.id == "regions"
    assert record.stats["repeats"] == {"blocks.* (Block, 30 nodes)": 3}
    assert record.remarks() == ("traced_once=[Block], regions=1, repeats={'blocks.* (Block, 30 nodes)': 3}, "
                                "joined_marked={'subgraph_1': 1}, spared_nodes=60")


def _saved_bytes(model: nn.Module, inputs: list[torch.Tensor]) -> int:
    """Bytes autograd keeps for the backward of one forward, each storage once."""
    storages: dict[int, int] = {}

    def pack(value: torch.Tensor) -> torch.Tensor:
        storages[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
        return value

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda value: value):
        model(*inputs)
    return sum(storages.values())


@pytest.mark.slow
def test_bodies_split_by_passkits_min_cut_save_less_than_torchs_and_stay_exact(tmp_path: Path) -> None:
    torch_bodies = TRAINING + '[override.joint]\nbodies = "torch_min_cut"\n'
    inputs = [torch.randn(2, 16, 32)]
    saved = {}
    for name, text in (("min_cut", TRAINING), ("torch_min_cut", torch_bodies)):
        _compare(lambda: transformer.TransformerStack(4, 32, 4), inputs, _pipeline(tmp_path, text))
        torch.manual_seed(0)
        compiled = passkit.compile(transformer.TransformerStack(4, 32, 4), pipeline=_pipeline(tmp_path, text), cache="off")
        saved[name] = _saved_bytes(compiled, inputs)
    assert saved["min_cut"] < saved["torch_min_cut"], saved


@pytest.mark.slow
def test_gpt2_under_training_with_regions_is_exact_without_dropout(tmp_path: Path) -> None:
    # Its attention's ``cat`` of an empty past is lowered in ``joint`` to a copy with other
    # strides than the body recorded; bodies keep their layouts there.
    pytest.importorskip("transformers")
    record = _compare(lambda: GPT2Logits(dropout=0.0), [torch.randint(0, 100, (2, 16))], _pipeline(tmp_path, TRAINING))
    assert record.stats["repeats"] == {"model.transformer.h.* (GPT2Block, 46 nodes)": 3}


@pytest.mark.slow
def test_block_stack_with_dropout_trains_exactly_on_training_with_regions(tmp_path: Path) -> None:
    record = _compare(lambda: Stack(4), [torch.randn(2, 16, 32)], _pipeline(tmp_path, TRAINING))
    assert record.stats["repeats"] == {"layers.* (DropoutBlock, 31 nodes)": 4}


def test_dropout_in_a_body_is_drawn_as_in_the_graph_around_it(tmp_path: Path) -> None:
    # torch functionalizes a body with autograd below it, where its Python decomposition of
    # dropout gave ATen's native_dropout: the same draws, but a kernel the layers inline do not
    # run (GPT-2's step with regions was 5% slower). The body draws with bernoulli, as eager.
    torch.manual_seed(0)
    eager = Stack(3)
    compiled = passkit.compile(copy.deepcopy(eager), pipeline=_pipeline(tmp_path, TRAINING), cache="off",
                               dump="all", dump_dir=str(tmp_path / "dump"))
    x = torch.randn(2, 16, 32)
    out, grads = _step(compiled, [x])
    expected, expected_grads = _step(eager, [x])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
    forward = next((tmp_path / "dump").glob("*/*-fx.dce-forward.py")).read_text()  # what Inductor gets
    assert "invoke_subgraph" in forward
    assert "native_dropout" not in forward
    assert forward.count("bernoulli") >= 3  # two in the body, one more for the first layer or its call


@pytest.mark.slow
def test_encoder_decoder_trains_exactly_on_training_with_regions(tmp_path: Path) -> None:
    record = _compare(EncoderDecoder, [torch.randn(2, 8, 32), torch.randn(2, 6, 32)], _pipeline(tmp_path, TRAINING))
    assert sorted(record.stats["repeats"].values()) == [2, 2]


@pytest.mark.slow
def test_gpt2_at_its_defaults_trains_exactly_on_training_with_regions(tmp_path: Path) -> None:
    # Dropout 0.1 in attention, residuals and embeddings, as Hugging Face's defaults.
    pytest.importorskip("transformers")
    record = _compare(GPT2Logits, [torch.randint(0, 100, (2, 16))], _pipeline(tmp_path, TRAINING))
    assert record.stats["repeats"] == {"model.transformer.h.* (GPT2Block, 46 nodes)": 3}


@pytest.mark.slow
def test_a_pipeline_with_the_steps_disabled_still_trains_exactly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = transformer.TransformerStack(2, 32, 4)
    compiled = passkit.compile(copy.deepcopy(model), pipeline=_pipeline(tmp_path, WITHOUT), cache="off")
    x = torch.randn(2, 8, 32)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    statuses = {record.id: record.status for record in compiled.passkit_reports[0].records}
    assert statuses["regions"] == "skipped"


class BranchLast(nn.Module):
    """Two calls of one layer kind, the second on the model's input (no grad) and made last, so
    that autograd differentiates it first: torch keeps the first backward it traces for a body."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.pre = nn.Linear(dim, dim)
        self.layers = nn.ModuleList(transformer.Block(dim, 4) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.layers[0](self.pre(x))
        return hidden + self.layers[1](x)


@pytest.mark.parametrize("overlay", [OVERLAY, TRAINING], ids=["training-python", "training"])
def test_a_layer_on_an_input_without_grad_shares_the_body_and_every_gradient_reaches_its_parameter(
        tmp_path: Path, overlay: str) -> None:
    record = _compare(BranchLast, [torch.randn(2, 8, 16)], _pipeline(tmp_path, overlay))
    assert record.stats["repeats"] == {"layers.* (Block, 30 nodes)": 2}


def test_a_layer_used_once_is_left_inline(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 8))
    compiled = passkit.compile(model, pipeline=_pipeline(tmp_path), cache="off")
    compiled(torch.randn(2, 8, requires_grad=True)).sum().backward()
    record = compiled.passkit_reports[0].records[0]
    assert record.stats == {"regions": 0}
    assert record.changed is False


def _passes_through(forward: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator as Hugging Face's on ``forward`` (``can_return_tuple``): Dynamo's frame is the
    wrapper's, so it reaches the model as ``L['args'][0]``, not ``L['self']``."""
    @functools.wraps(forward)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return forward(*args, **kwargs)

    return wrapper


class WrappedStack(Stack):
    forward = _passes_through(Stack.forward)


def test_layers_of_a_model_whose_forward_is_wrapped_are_labelled_as_the_model_names_them(tmp_path: Path) -> None:
    record = _compare(lambda: WrappedStack(3), [torch.randn(2, 8, 32)], _pipeline(tmp_path))
    assert record.stats["repeats"] == {"layers.* (DropoutBlock, 31 nodes)": 3}


class WritesOutside(nn.Module):
    """A block that also writes its result into a tensor it was handed: in place, or an item."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.block, self.how = transformer.Block(16, 4), how

    def forward(self, x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        if self.how == "add":
            total += y
        else:
            total[:, 0] = y[:, 0]
        return y


class Accumulating(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.layers = nn.ModuleList(WritesOutside(how) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = torch.zeros_like(x)
        for layer in self.layers:
            x = layer(x, total)
        return x + total


@pytest.mark.parametrize("overlay", [OVERLAY, TRAINING], ids=["training-python", "training"])
@pytest.mark.parametrize("how", ["add", "item"])
def test_a_layer_that_writes_a_tensor_from_outside_is_left_inline_and_exact(tmp_path: Path, how: str,
                                                                             overlay: str) -> None:
    # ``total += y`` reaches the graph as _operator.iadd and ``total[:, 0] = ...`` as setitem: a
    # body may not write its operands, so `regions` leaves these layers inline, and under
    # `training` capture inlines the bodies `trace_once` marked.
    record = _compare(lambda: Accumulating(how), [torch.randn(2, 8, 16)], _pipeline(tmp_path, overlay))
    assert (record.stats["regions"], "repeats" in record.stats) == (0, False)


def test_annotated_regions_are_kept_as_the_user_marked_them(tmp_path: Path) -> None:
    @torch.compiler.nested_compile_region
    def layer(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w).sin()

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return layer(layer(x, w), w)

    x, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 6, requires_grad=True)
    compiled = passkit.compile(fn, pipeline=_pipeline(tmp_path), cache="off")
    out = compiled(x, w)
    out.sum().backward()
    torch.testing.assert_close(out, fn(x, w))
    assert compiled.passkit_reports[0].records[0].stats == {"regions": 0}


class MarkedBlock(transformer.Block):
    forward = torch.compiler.nested_compile_region(transformer.Block.forward)


def _marked_stack() -> nn.Module:
    stack = transformer.TransformerStack(4, 32, 4)
    for block in stack.blocks:
        block.__class__ = MarkedBlock
    return stack


@pytest.mark.parametrize("overlay", [OVERLAY, TRAINING], ids=["training-python", "training"])
def test_a_layer_dynamo_left_inline_joins_the_users_marked_body(tmp_path: Path, overlay: str) -> None:
    # Dynamo inlines the first marked block (its input needs no grad, the others' do): a body used once.
    record = _compare(_marked_stack, [torch.randn(2, 8, 32)], _pipeline(tmp_path, overlay))
    assert record.stats == {"regions": 0, "joined_marked": {"subgraph_1": 1}, "spared_nodes": 30}


@pytest.mark.parametrize("dynamic", [None, True], ids=["recompiled-symbolic", "dynamic"])
def test_a_marked_stack_trains_exactly_at_new_batch_sizes(dynamic: bool | None) -> None:
    # Its body of symbolic sizes reads the sizes and each LayerNorm's eps as operands (and was
    # handed the float, not the tensor, from the third call on): capture compiles it flat.
    torch.manual_seed(0)
    model = _marked_stack()
    eager = copy.deepcopy(model)
    compiled = passkit.compile(model, pipeline="training-python", cache="off", dynamic=dynamic)
    for batch in (2, 3, 5):
        x = torch.randn(batch, 8, 32)
        for parameter in [*model.parameters(), *eager.parameters()]:
            parameter.grad = None
        out, grads = _step(compiled, [x])
        expected, expected_grads = _step(eager, [x])
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        for grad, expected_grad in zip(grads, expected_grads):
            torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)


def test_two_marked_functions_with_the_same_code_share_one_body(tmp_path: Path) -> None:
    def layer(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w).sin()

    def twin(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w).sin()

    first, second = torch.compiler.nested_compile_region(layer), torch.compiler.nested_compile_region(twin)

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return second(second(first(first(x, w), w), w), w)

    x, w = torch.randn(4, 6, requires_grad=True), torch.randn(6, 6, requires_grad=True)
    compiled = passkit.compile(fn, pipeline=_pipeline(tmp_path), cache="off")
    out = compiled(x, w)
    grads = torch.autograd.grad(out.sum(), (x, w))
    expected = fn(x, w)
    torch.testing.assert_close(out, expected)
    for grad, expected_grad in zip(grads, torch.autograd.grad(expected.sum(), (x, w))):
        torch.testing.assert_close(grad, expected_grad)
    assert compiled.passkit_reports[0].records[0].stats == {"regions": 0, "joined_marked": {"subgraph_0": 2}, "spared_nodes": 6}


class AnnotatedDropoutLayers(nn.Module):
    """The user's own regions (``nested_compile_region``), each with dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.drop = nn.Dropout(0.1)

    @torch.compiler.nested_compile_region
    def layer(self, linear: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.relu(linear(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for linear in self.linears:
            x = self.layer(linear, x)
        return x


def test_annotated_regions_with_dropout_train_exactly_on_training_python() -> None:
    # joint splits each body once: torch's rule alone recomputed the forward (new masks) in the backward.
    record = _compare(AnnotatedDropoutLayers, [torch.randn(4, 16)], "training-python")
    assert record.id == "functionalize"


@pytest.mark.slow
def test_annotated_regions_with_dropout_train_exactly_on_training() -> None:
    # Every call of a body shared its saved values' fake tensors, and codegen.inductor's re-trace
    # through Inductor's decompositions then fed every backward call the last forward call's mask.
    record = _compare(AnnotatedDropoutLayers, [torch.randn(4, 16)], "training")
    assert record.id == "regions"  # training's own step keeps the user's marked bodies
