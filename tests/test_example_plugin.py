"""The worked plugin in plugins/passkit-example, seen from passkit: listed, its pipeline found, run.

The plugin is a separate distribution, installed with
``pip install -e ".[dev]" -e plugins/passkit-example`` (the README's quick start). These tests
use only what a user sees: the CLI listings and a compiled function's report.
"""

from __future__ import annotations

import importlib.metadata
import json

import pytest
import torch
from click.testing import CliRunner

import passkit
from passkit.cli import main


@pytest.fixture(autouse=True)
def plugin_installed() -> None:
    try:
        importlib.metadata.distribution("passkit-example")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("passkit-example is not installed; run: pip install -e plugins/passkit-example", pytrace=False)


def test_passes_lists_the_plugin_pass_with_its_distribution() -> None:
    result = CliRunner().invoke(main, ["passes", "--json"])
    assert result.exit_code == 0, result.stderr
    listed = {entry["name"]: entry for entry in json.loads(result.stdout)}
    entry = listed["example.remove_noops"]
    assert entry["plugin"] == "example"
    assert entry["distribution"] == "passkit-example"
    assert entry["requires"] == ["functional"]
    assert entry["summary"] == "Remove ops that return their input unchanged: same-shape views, x*1, x/1, x-0, int x+0."
    assert [option["name"] for option in entry["options"]] == ["ops", "max_rewrites"]


def test_pipelines_lists_the_plugin_pipeline() -> None:
    result = CliRunner().invoke(main, ["pipelines", "--json"])
    assert result.exit_code == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    row = rows["training-noops"]
    assert row["description"] == "The training pipeline plus example.remove_noops after joint"
    assert row["file"].endswith("passkit_example/pipelines/training-noops.toml")


def with_noops(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    hidden = (x * 1).view(4, 3) @ w          # x * 1 and a same-shape view: both no-ops
    return (hidden.reshape(4, 2) / 1).tanh().sum(0)


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_plugin_pipeline_compiles_matches_eager_and_reports_rewrites(training: bool) -> None:
    x, w = torch.randn(4, 3), torch.randn(3, 2, requires_grad=training)
    compiled = passkit.aot_function(with_noops, pipeline="training-noops")

    out = compiled(x, w)
    w_eager = w.detach().clone().requires_grad_(training)
    expected = with_noops(x, w_eager)

    torch.testing.assert_close(out, expected)
    if training:
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(w.grad, w_eager.grad)
    (report,) = compiled.passkit_reports
    (record,) = [r for r in report.records if r.pass_name == "example.remove_noops"]
    assert record.status == "ran"
    assert record.changed
    assert record.stats["rewrites"] > 0
    assert record.nodes_after == record.nodes_before - record.stats["rewrites"]
