"""The attention set's ``cpu_causal_blocks`` option: causal CPU attention as math in row blocks."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import passkit
from passkit.errors import PipelineError
from passkit.examples import transformer
from tiny_programs import assert_loss_and_grads_match


def _pipeline(tmp_path, body: str, base: str = "training-python") -> str:
    path = tmp_path / "blocks.toml"
    path.write_text(f'[pipeline]\nname = "blocks"\nextends = "{base}"\n\n[override.attention]\n{body}\n')
    return str(path)


def _blocks(tmp_path, blocks: int) -> str:
    return _pipeline(tmp_path, f"set_options.attention.cpu_causal_blocks = {blocks}")


def _attention_graph(tmp_path, model: torch.nn.Module, x: torch.Tensor, pipeline: str) -> tuple[dict, str]:
    """The attention step's report row and the main graph it wrote, after a step that trained
    like eager."""
    model.zero_grad(set_to_none=True)
    twin = copy.deepcopy(model)
    dump = tmp_path / "dump"
    compiled = passkit.aot_module(twin, pipeline=pipeline, dump="all", dump_dir=str(dump))
    assert_loss_and_grads_match(compiled(x), model(x), model, twin)
    stats = next(r for r in compiled.passkit_reports[0].records if r.id == "attention").stats
    (graph,) = dump.glob("*/*-attention-main.py")
    return stats, graph.read_text()


def test_causal_attention_becomes_blocks_of_math_that_train_like_eager(tmp_path) -> None:
    model, _ = transformer.block()
    stats, graph = _attention_graph(tmp_path, model, torch.randn(2, 128, 64), _blocks(tmp_path, 4))
    assert stats["applied"] == {"attention:div_masked_fill": 1}
    assert "scaled_dot_product" not in graph
    # Four blocks of 32 query rows, each against the keys up to its last row: 2 bmm a block.
    assert graph.count("torch.ops.aten.bmm.default(") == 8
    for stop in (32, 64, 96, 128):
        assert f"torch.ops.aten.ones.default([32, {stop}]" in graph


def test_rows_that_do_not_divide_make_a_smaller_last_block(tmp_path) -> None:
    model, _ = transformer.block()
    _, graph = _attention_graph(tmp_path, model, torch.randn(2, 30, 64), _blocks(tmp_path, 4))
    # ceil(30 / 4) = 8 rows a block: 8, 8, 8 and 6.
    assert [f"ones.default([{r}, {c}]" in graph for r, c in ((8, 8), (8, 16), (8, 24), (6, 30))] == [True] * 4


def test_one_block_is_the_plain_math(tmp_path) -> None:
    model, _ = transformer.block()
    _, graph = _attention_graph(tmp_path, model, torch.randn(2, 16, 64), _blocks(tmp_path, 1))
    assert graph.count("torch.ops.aten.bmm.default(") == 2 and "scaled_dot_product" not in graph


def _masked_attention(q, k, v):
    mask = torch.ones(8, 8, dtype=torch.bool).triu()  # each row keeps itself and the keys after it
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


def test_a_mask_that_is_not_causal_still_becomes_sdpa(tmp_path) -> None:
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    dump = tmp_path / "dump"
    compiled = passkit.aot_function(_masked_attention, pipeline=_blocks(tmp_path, 4), dump="all", dump_dir=str(dump))
    torch.testing.assert_close(compiled(q, k, v), _masked_attention(q, k, v))
    (graph,) = dump.glob("*/*-attention-main.py")
    assert "scaled_dot_product_attention" in graph.read_text()


def test_the_blocks_take_only_what_passes_the_size_gate(tmp_path) -> None:
    body = "set_options.attention.cpu_causal_blocks = 4\nset_options.attention.cpu_min_score_bytes = 131072"
    model, (x,) = transformer.block()  # 64 KiB of scores: under the gate, it stays one math block
    stats, graph = _attention_graph(tmp_path, model, x, _pipeline(tmp_path, body))
    assert stats["applied"] == {} and graph.count("torch.ops.aten.bmm.default(") == 2


def _causal_attention(q, k, v):
    mask = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool, device=q.device).tril()
    return (q @ k.transpose(-2, -1) * 0.25).masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


def test_a_dynamic_batch_runs_in_blocks_and_reuses_the_graph(tmp_path) -> None:
    options = {"pipeline": _blocks(tmp_path, 2)}
    compiled = torch.compile(_causal_attention, backend="passkit", options=options)
    before = len(passkit.reports())
    for batch in (2, 3):
        q, k, v = (torch.randn(batch, 4, 8, 16) for _ in range(3))
        for t in (q, k, v):
            torch._dynamo.mark_dynamic(t, 0)
        torch.testing.assert_close(compiled(q, k, v), _causal_attention(q, k, v))
    (report,) = passkit.reports()[before:]  # the batch of 3 reused the graph
    (record,) = [r for r in report.records if r.id == "attention"]
    assert record.stats["applied"] == {"attention:mul_masked_fill": 1}


def test_the_default_pipeline_runs_long_causal_attention_in_two_blocks(tmp_path) -> None:
    body = 'disable = ["codegen.inductor"]\n\n[[steps]]\npass = "codegen.python"\n'
    path = tmp_path / "training-quick.toml"
    path.write_text(f'[pipeline]\nname = "training-quick"\nextends = "training"\n\n{body}')
    model, _ = transformer.block()
    stats, graph = _attention_graph(tmp_path, model, torch.randn(2, 128, 64), str(path))
    assert stats["applied"] == {"attention:div_masked_fill": 1} and graph.count("torch.ops.aten.bmm.default(") == 4
    assert "torch.ops.aten.ones.default([64, 128]" in graph


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "Input should be greater than or equal to 0"),
        ("65", "Input should be less than or equal to 64"),
        ("2.5", "Input should be a valid integer, got a number with a fractional part"),
    ],
)
def test_a_bad_block_count_fails_in_one_line_when_the_file_loads(tmp_path, value: str, message: str) -> None:
    path = _pipeline(tmp_path, f"set_options.attention.cpu_causal_blocks = {value}")
    with pytest.raises(PipelineError) as info:
        passkit.load_pipeline(path)
    assert str(info.value) == f"{path}: override.attention: set_options.attention.cpu_causal_blocks: {message}"
