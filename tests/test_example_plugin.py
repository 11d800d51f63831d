"""The worked plugin in plugins/passkit-example, seen from passkit: listed, its pipeline found, run.

The plugin is a separate distribution, installed with ``pip install -e . -e
plugins/passkit-example`` (the README's first quick-start command). These tests use only what a
user sees: the CLI listings and a compiled function's report.
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


def test_patterns_lists_the_plugin_set_with_its_distribution() -> None:
    result = CliRunner().invoke(main, ["patterns", "--json"])
    assert result.exit_code == 0, result.stderr
    listed = {entry["name"]: entry for entry in json.loads(result.stdout)}
    entry = listed["example:gelu_tanh"]
    assert entry["plugin"] == "plugin 'example' (passkit-example 0.1.0)"
    assert entry["description"] == "exact GELU -> tanh-approximated GELU"
    assert [p["name"] for p in entry["patterns"]] == ["example:gelu_tanh:gelu_tanh"]
    assert entry["tolerance"] == {"rtol": 1e-3, "atol": 5e-3}  # what the tanh form moves results and gradients by


def test_pipelines_lists_the_plugin_pipeline() -> None:
    result = CliRunner().invoke(main, ["pipelines", "--json"])
    assert result.exit_code == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    row = rows["training-gelu-tanh"]
    assert row["description"] == "The training-python pipeline with GELU rewritten to its tanh approximation"
    assert row["file"].endswith("passkit_example/pipelines/training-gelu-tanh.toml")


class TanhMLP(torch.nn.Module):
    """The MLP an exact-GELU model becomes under example:gelu_tanh, written out for eager."""

    def __init__(self, source: torch.nn.Module) -> None:
        super().__init__()
        self.net = source.net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linear, norm, _, out = self.net
        return out(torch.nn.functional.gelu(norm(linear(x)), approximate="tanh"))


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_plugin_pipeline_from_toml_compiles_to_the_tanh_form_and_reports_counts(training: bool) -> None:
    import copy

    from passkit.examples import transformer

    model, (x,) = transformer.mlp()
    model.requires_grad_(training)
    reference = TanhMLP(copy.deepcopy(model))
    compiled = passkit.aot_module(model, pipeline="training-gelu-tanh")

    out = compiled(x)
    expected = reference(x)
    torch.testing.assert_close(out, expected)
    with torch.no_grad():
        assert not torch.allclose(out, model(x), rtol=0, atol=1e-6)  # the exact-GELU model differs
    if training:
        out.sum().backward()
        expected.sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    (report,) = compiled.passkit_reports
    (record,) = [r for r in report.records if r.id == "gelu_tanh"]
    assert record.status == "ran" and record.changed
    assert record.stats["applied"] == {"example:gelu_tanh:gelu_tanh": 1}
