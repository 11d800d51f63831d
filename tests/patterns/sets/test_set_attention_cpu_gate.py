"""The attention set's ``cpu_min_score_bytes`` option: small CPU attention stays math, and says so."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from click.testing import CliRunner

import passkit
from passkit.cli import main
from passkit.errors import PipelineError
from passkit.examples import transformer
from tiny_programs import assert_loss_and_grads_match

# transformer.block(): 4 heads, input (4, 32, 64): 4 * 4 * 32 * 32 float32 scores.
BLOCK_SCORE_BYTES = 4 * 4 * 32 * 32 * 4


def _pipeline(tmp_path, name: str, body: str, base: str = "training-python") -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[pipeline]\nname = "{name}"\nextends = "{base}"\n\n{body}')
    return str(path)


def _gated(tmp_path, limit: int) -> str:
    return _pipeline(tmp_path, f"gate{limit}", f"[override.attention]\nset_options.attention.cpu_min_score_bytes = {limit}\n")


def _train_like_eager(model: torch.nn.Module, x: torch.Tensor, pipeline: str) -> dict:
    """The attention step's report row, after a step that trained like eager."""
    model.zero_grad(set_to_none=True)
    twin = copy.deepcopy(model)
    compiled = passkit.aot_module(twin, pipeline=pipeline)
    assert_loss_and_grads_match(compiled(x), model(x), model, twin)
    return next(r for r in compiled.passkit_reports[0].records if r.id == "attention").stats


def test_attention_under_the_limit_stays_math_and_the_report_says_why(tmp_path) -> None:
    model, (x,) = transformer.block()
    stats = _train_like_eager(model, x, _gated(tmp_path, BLOCK_SCORE_BYTES + 1))
    assert stats["applied"] == {}
    assert stats["refused"] == {
        f"attention:div_masked_fill: scores of {BLOCK_SCORE_BYTES} B under cpu_min_score_bytes = {BLOCK_SCORE_BYTES + 1}": 1
    }


def test_attention_at_the_limit_is_rewritten(tmp_path) -> None:
    model, (x,) = transformer.block()
    stats = _train_like_eager(model, x, _gated(tmp_path, BLOCK_SCORE_BYTES))
    assert stats["applied"] == {"attention:div_masked_fill": 1}
    assert "refused" not in stats


def _scaled_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1) @ v


def test_a_dynamic_batch_is_judged_by_its_hint(tmp_path) -> None:
    """With a symbolic batch the size is the one this call traced with; no guard is added."""
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))  # 2 * 4 * 8 * 8 * 4 = 2048 B of scores
    options = {"pipeline": _gated(tmp_path, 2049)}
    compiled = torch.compile(_scaled_attention, backend="passkit", options=options, dynamic=True)
    before = len(passkit.reports())
    torch.testing.assert_close(compiled(q, k, v), _scaled_attention(q, k, v))
    (record,) = [r for report in passkit.reports()[before:] for r in report.records if r.id == "attention"]
    assert record.stats["refused"] == {"attention:mul_none: scores of 2048 B under cpu_min_score_bytes = 2049": 1}
    q3, k3, v3 = (torch.randn(3, 4, 8, 16) for _ in range(3))
    torch.testing.assert_close(compiled(q3, k3, v3), _scaled_attention(q3, k3, v3))
    assert len(passkit.reports()) == before + 1  # the batch of 3 reused the graph


def test_the_default_pipeline_gates_small_cpu_attention_only(tmp_path) -> None:
    """``training`` (codegen swapped for the quick Python one here) keeps the d=64 block's 64 KiB
    of scores as math and rewrites the same block on 128-token inputs (1 MiB)."""
    body = 'disable = ["codegen.inductor"]\n\n[[steps]]\npass = "codegen.python"\n'
    pipeline = _pipeline(tmp_path, "training-quick", body, base="training")
    model, (x,) = transformer.block()
    small = _train_like_eager(model, x, pipeline)
    assert small["applied"] == {} and list(small["refused"]) == [
        f"attention:div_masked_fill: scores of {BLOCK_SCORE_BYTES} B under cpu_min_score_bytes = 131072"
    ]
    long = _train_like_eager(model, torch.randn(4, 128, 64), pipeline)
    assert long["applied"] == {"attention:div_masked_fill": 1}


ERRORS = {
    "negative": (
        "set_options.attention.cpu_min_score_bytes = -1",
        "override.attention: set_options.attention.cpu_min_score_bytes: Input should be greater than or equal to 0",
    ),
    "misspelt option": (
        "set_options.attention.cpu_min_scores = 1",
        "override.attention: set_options.attention.cpu_min_scores: Extra inputs are not permitted",
    ),
    "not a number": (
        'set_options.attention.cpu_min_score_bytes = "1 MiB"',
        "override.attention: set_options.attention.cpu_min_score_bytes: Input should be a valid integer, "
        "unable to parse string as an integer",
    ),
    "a set the step does not apply": (
        "set_options.noops.x = 1",
        "override.attention: set_options names 'noops', which patterns does not list (attention)",
    ),
    "a set without options": (
        'patterns = ["attention", "noops"]\nset_options.noops.x = 1',
        "override.attention: pattern set 'noops' takes no options",
    ),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_set_options_fail_in_one_line_when_the_file_loads(tmp_path, case: str) -> None:
    body, message = ERRORS[case]
    path = _pipeline(tmp_path, "bad", f"[override.attention]\n{body}\n")
    with pytest.raises(PipelineError) as info:
        passkit.load_pipeline(path)
    assert str(info.value) == f"{path}: {message}"


def test_passkit_patterns_lists_each_sets_options_with_their_defaults() -> None:
    listed = CliRunner().invoke(main, ["patterns", "--json"])
    assert listed.exit_code == 0, listed.stderr
    options = {row["name"]: row["options"] for row in json.loads(listed.stdout)}
    assert options["attention"] == {"cpu_min_score_bytes": 0, "cpu_causal_blocks": 0} and options["noops"] == {}
    table = CliRunner().invoke(main, ["patterns"])
    assert "cpu_min_score_bytes = 0" in next(line for line in table.stdout.splitlines() if line.startswith("attention "))
