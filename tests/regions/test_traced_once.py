"""The ``regions`` step's ``trace_once``: Dynamo traces each repeated layer once, and training
stays exact to eager with the user's model unchanged between calls."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

import passkit
from passkit.examples import transformer
from passkit.examples.moe import MoE
from passkit.regions.traced_once import LayerMarks, repeated_layers

ONCE = """
[pipeline]
name = "{base}-once"
extends = "{base}"

[[steps]]
pass = "regions"
before = "functionalize"
trace_once = true
"""

# ``training`` has the step with ``trace_once`` on already.
ONCE_ON_TRAINING = """
[pipeline]
name = "{base}-once"
extends = "{base}"

[override.regions]
trace_once = true
"""


class DropoutStack(nn.Module):
    """Four acceptance blocks, each followed by dropout (p=0.1), in an ``nn.ModuleList``."""

    def __init__(self, layers: int = 4, dim: int = 32) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(transformer.Block(dim, 4), nn.Dropout(0.1)) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _pipeline(tmp_path: Path, base: str) -> str:
    path = tmp_path / f"{base}-once.toml"
    path.write_text((ONCE_ON_TRAINING if base == "training" else ONCE).format(base=base))
    return str(path)


def _step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    for parameter in model.parameters():
        parameter.grad = None
    torch.manual_seed(1234)
    out = model(x)
    (out * torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape)).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("base", ["training-python", pytest.param("training", marks=pytest.mark.slow)])
def test_each_layer_traced_once_trains_exactly_and_the_model_keeps_its_classes(tmp_path: Path, base: str) -> None:
    torch.manual_seed(0)
    model = DropoutStack()
    eager = copy.deepcopy(model)
    compiled = passkit.compile(model, pipeline=_pipeline(tmp_path, base), cache="off")
    x = torch.randn(2, 16, 32)
    for _ in range(2):  # the second call runs what the first compiled: no recompile
        out, grads = _step(compiled, x)
        expected, expected_grads = _step(eager, x)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        for grad, expected_grad in zip(grads, expected_grads):
            torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
    assert len(compiled.passkit_reports) == 1
    assert [type(layer) for layer in model.layers] == [nn.Sequential] * 4
    record = compiled.passkit_reports[0].records[0]
    assert record.id == "regions"
    # Dynamo traced the layer once and stamped it out three times; the first, left inline, joined it.
    assert record.stats["traced_once"] == ["Sequential"]
    assert record.stats["joined_marked"] == {"subgraph_1": 1}
    assert record.stats["regions"] == 1
    assert list(record.stats["repeats"].values()) == [4]  # reported as the layers it outlines itself


def test_only_the_outermost_repeated_items_are_marked() -> None:
    model = nn.Sequential(
        nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)) for _ in range(3)),
        nn.Linear(4, 4),
    )
    layers = repeated_layers(model)
    assert layers == list(model[0])  # the linears inside each item and the lone one stay as they are
    with LayerMarks(layers):
        assert all(type(layer) is not nn.Sequential and isinstance(layer, nn.Sequential) for layer in layers)
        assert type(layers[0]).__qualname__ == "Sequential"
    assert all(type(layer) is nn.Sequential for layer in layers)


def test_a_layer_class_that_refuses_subclasses_is_traced_as_it_is(tmp_path: Path) -> None:
    class Sealed(nn.Linear):
        def __init_subclass__(cls, **kwargs: object) -> None:
            raise TypeError("Sealed takes no subclasses")

    torch.manual_seed(0)
    model = nn.Sequential(*(Sealed(8, 8) for _ in range(3)))
    assert repeated_layers(model) == []
    compiled = passkit.compile(copy.deepcopy(model), pipeline=_pipeline(tmp_path, "training-python"), cache="off")
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x), model(x))
    assert "traced_once" not in compiled.passkit_reports[0].records[0].stats


def test_a_class_the_user_marked_is_left_to_the_user() -> None:
    class Marked(nn.Linear):
        forward = torch.compiler.nested_compile_region(nn.Linear.forward)

    assert repeated_layers(nn.ModuleList(Marked(4, 4) for _ in range(3))) == []


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt2", "encoder_decoder"])
def test_hugging_face_gpt2_and_an_encoder_decoder_train_exactly_with_each_layer_traced_once(
        tmp_path: Path, model: str) -> None:
    from regions.test_regions import EncoderDecoder, GPT2Logits, _compare

    if model == "gpt2":
        pytest.importorskip("transformers")
        record = _compare(GPT2Logits, [torch.randint(0, 100, (2, 16))], _pipeline(tmp_path, "training-python"))
        traced = ["GPT2Block"]
        repeats = {"model.transformer.h.* (GPT2Block, 46 nodes)": 3}
    else:
        record = _compare(EncoderDecoder, [torch.randn(2, 8, 32), torch.randn(2, 6, 32)], _pipeline(tmp_path, "training-python"))
        traced = ["TransformerDecoderLayer", "TransformerEncoderLayer"]
        repeats = {"model.decoder.layers.* (TransformerDecoderLayer, 22 nodes)": 2,
                   "model.encoder.layers.* (TransformerEncoderLayer, 14 nodes)": 2}
    assert record.id == "regions"
    # Dynamo traced each layer kind once and stamped it out; the report counts the calls of each.
    assert (record.stats["traced_once"], record.stats["repeats"]) == (traced, repeats)


@pytest.mark.parametrize("dynamic", [None, True], ids=["recompiled-symbolic", "dynamic"])
def test_new_batch_sizes_train_exactly_with_each_layer_traced_once(tmp_path: Path, dynamic: bool | None) -> None:
    # A body of symbolic sizes takes the sizes and LayerNorm's eps as operands; capture inlines it.
    torch.manual_seed(0)
    model = transformer.TransformerStack(3, 32, 4)
    eager = copy.deepcopy(model)
    compiled = passkit.compile(model, pipeline=_pipeline(tmp_path, "training-python"), cache="off", dynamic=dynamic)
    for batch in (2, 3, 5):
        x = torch.randn(batch, 8, 32)
        out, grads = _step(compiled, x)
        expected, expected_grads = _step(eager, x)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        for grad, expected_grad in zip(grads, expected_grads):
            torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
    assert len(compiled.passkit_reports) == (2 if dynamic is None else 1)


class ConvBlock(nn.Module):
    """Conv, batch norm (running statistics: a buffer written in place), ReLU, a residual."""

    def __init__(self, channels: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)  # a bias before batch norm has no gradient
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.conv(x))) + x


class InPlaceResidual(nn.Module):
    """A layer that scales its input in place before reading it."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)
        return x + self.norm(self.linear(x)).tanh()


@pytest.mark.parametrize(("layers", "shape"), [
    (lambda: nn.Sequential(*(ConvBlock() for _ in range(4))), (2, 4, 6, 6)),  # training marks 4 repeats or more
    (lambda: nn.Sequential(nn.Linear(16, 16), *(InPlaceResidual() for _ in range(4))), (4, 16)),
], ids=["batch-norm", "in-place-residual"])
def test_a_layer_that_writes_its_operands_is_traced_inline_and_trains_exactly(layers, shape) -> None:
    # torch trains no marked body that writes into an operand; passkit traces such a layer inline.
    torch.manual_seed(0)
    eager = layers()
    twin = copy.deepcopy(eager)
    compiled = passkit.compile(twin, pipeline="training", cache="off")
    x = torch.randn(*shape)
    out, grads = _step(compiled, x)
    expected, expected_grads = _step(eager, x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
    for buffer, expected_buffer in zip(twin.buffers(), eager.buffers()):  # batch norm's running statistics
        torch.testing.assert_close(buffer, expected_buffer)
    assert compiled.passkit_reports[0].records[0].stats["traced_once"]


def test_leaf_layers_are_not_marked() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    assert repeated_layers(model) == []
    stack = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
    assert repeated_layers(stack) == list(stack)


class BreakingBlock(InPlaceResidual):
    """A block with a graph break inside: Dynamo cannot trace it whole as a marked region."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.linear(x)).tanh() + x
        torch._dynamo.graph_break()
        return x * 0.5


class BreakingStack(nn.Module):
    def __init__(self, break_first: bool = False) -> None:
        super().__init__()
        self.first = nn.Linear(16, 16)
        self.layers = nn.ModuleList(BreakingBlock() for _ in range(4))
        self.break_first = break_first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        if self.break_first:
            torch._dynamo.graph_break()
        for layer in self.layers:
            x = layer(x)
        return x


def test_layers_dynamo_cannot_trace_whole_are_traced_as_they_are_and_train_exactly() -> None:
    # T5's layers break Dynamo's graph inside: a marked layer then fails the whole compile. No
    # code ran yet, so the call is traced again with nothing marked.
    torch.manual_seed(0)
    eager = BreakingStack()
    compiled = passkit.compile(copy.deepcopy(eager), pipeline="training-python", cache="off")
    once = passkit.compile(copy.deepcopy(eager), pipeline="training", cache="off")
    x = torch.randn(4, 16)
    expected, expected_grads = _step(eager, x)
    for model in (compiled, once):
        out, grads = _step(model, x)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        for grad, expected_grad in zip(grads, expected_grads):
            torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
    assert once.passkit_backend.traced_once == []
    assert all("traced_once" not in report.records[0].stats for report in once.passkit_reports)


def test_a_layer_dynamo_cannot_trace_whole_after_part_of_the_model_ran_is_one_line() -> None:
    compiled = passkit.compile(BreakingStack(break_first=True), pipeline="training", cache="off")
    with pytest.raises(passkit.PasskitError) as caught:
        compiled(torch.randn(4, 16))
    assert str(caught.value) == ("trace_once: Dynamo cannot trace a marked layer (BreakingBlock) whole, after part of "
                                 "the model ran; set trace_once = false on the regions step")


def test_layers_called_on_data_dependent_rows_are_traced_as_they_are_and_train_exactly() -> None:
    # Dynamo's check whether a marked layer's earlier trace fits compares two experts' row
    # counts, both unbacked: it cannot decide, and the compile failed.
    torch.manual_seed(0)
    eager = MoE()
    once = passkit.compile(copy.deepcopy(eager), pipeline="training", cache="off")
    x = torch.randn(32, 16)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        expected, expected_grads = _step(eager, x)
        out, grads = _step(once, x)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
    assert once.passkit_backend.traced_once == []
