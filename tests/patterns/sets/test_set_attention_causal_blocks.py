"""The attention set's ``cpu_causal_blocks`` option: causal CPU attention as math in row blocks."""

from __future__ import annotations

import copy
import math
import re

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


def _in_blocks(tmp_path, blocks: int) -> str:
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


def _blocks(graph: str) -> list[tuple[int, int, int]]:
    """(first row, end row, keys read) of each block, from the positions its causal mask compares:
    the block's rows, then the keys it reads."""
    ranges = [(int(a), int(b)) for a, b in re.findall(r"aten\.arange\.start\((\d+), (\d+),", graph)]
    return [(start, stop, keys) for (start, stop), (_, keys) in zip(ranges[::2], ranges[1::2], strict=True)]


def test_causal_attention_becomes_blocks_of_math_that_train_like_eager(tmp_path) -> None:
    model, _ = transformer.block()
    stats, graph = _attention_graph(tmp_path, model, torch.randn(2, 128, 64), _in_blocks(tmp_path, 4))
    assert stats["applied"] == {"attention:div_masked_fill": 1}
    assert "scaled_dot_product" not in graph
    # Four blocks of 32 query rows, each against the keys up to its last row: 2 bmm a block.
    assert graph.count("torch.ops.aten.bmm.default(") == 8
    assert _blocks(graph) == [(0, 32, 32), (32, 64, 64), (64, 96, 96), (96, 128, 128)]


def test_rows_that_do_not_divide_make_a_smaller_last_block(tmp_path) -> None:
    model, _ = transformer.block()
    _, graph = _attention_graph(tmp_path, model, torch.randn(2, 30, 64), _in_blocks(tmp_path, 4))
    # ceil(30 / 4) = 8 rows a block: 8, 8, 8 and 6.
    assert _blocks(graph) == [(0, 8, 8), (8, 16, 16), (16, 24, 24), (24, 30, 30)]


def test_one_block_is_the_plain_math(tmp_path) -> None:
    model, _ = transformer.block()
    _, graph = _attention_graph(tmp_path, model, torch.randn(2, 16, 64), _in_blocks(tmp_path, 1))
    assert graph.count("torch.ops.aten.bmm.default(") == 2 and "scaled_dot_product" not in graph


def _masked_attention(q, k, v):
    mask = torch.ones(8, 8, dtype=torch.bool).triu()  # each row keeps itself and the keys after it
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


def test_a_mask_that_is_not_causal_still_becomes_sdpa(tmp_path) -> None:
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    dump = tmp_path / "dump"
    compiled = passkit.aot_function(_masked_attention, pipeline=_in_blocks(tmp_path, 4), dump="all", dump_dir=str(dump))
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
    options = {"pipeline": _in_blocks(tmp_path, 2)}
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
    assert _blocks(graph) == [(0, 64, 64), (64, 128, 128)]


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


def _causal_attention_4d_mask(q, k, v):
    mask = torch.ones(1, 1, q.shape[-2], q.shape[-2], dtype=torch.bool).tril()  # HF-style (1, 1, S, S)
    return (q @ k.transpose(-2, -1) * 0.25).masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v


def test_a_causal_mask_with_batch_and_head_dimensions_is_cut_to_its_matrix(tmp_path) -> None:
    q, k, v = (torch.randn(2, 4, 12, 16, requires_grad=True) for _ in range(3))
    dump = tmp_path / "dump"
    compiled = passkit.aot_function(_causal_attention_4d_mask, pipeline=_in_blocks(tmp_path, 3), dump="all", dump_dir=str(dump))
    out = compiled(q, k, v)
    expected = _causal_attention_4d_mask(q, k, v)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    torch.testing.assert_close(grads, torch.autograd.grad(expected.sum(), (q, k, v)))
    (graph,) = dump.glob("*/*-attention-main.py")
    assert graph.read_text().count("torch.ops.aten.bmm.default(") == 6  # 3 blocks of 4 rows
