"""`passkit export` for real: a model factory from the command line, the program or package it
writes, the verdict against eager, JSON, exit codes and one-line refusals."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from passkit.cli import main

MODELS = textwrap.dedent(
    '''
    import torch

    def mlp():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
        return model, (torch.randn(3, 8),)
    '''
)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "export_models_cli.py").write_text(MODELS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _invoke(*args: str) -> object:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_export_writes_a_program_that_loads_and_matches_eager_at_another_batch(workdir: Path) -> None:
    result = _invoke("export", "export", "--model", "export_models_cli:mlp", "-o", "out/mlp.pt2", "--dynamic", "0")
    assert result.exit_code == 0, result.output
    assert "[4/4]  fx.dce" in result.output
    assert result.output.splitlines()[-1].startswith(
        "ok: export on export_models_cli:mlp: the exported program out/mlp.pt2 vs eager: outputs max |diff| "
    )
    loaded = torch.export.load(workdir / "out" / "mlp.pt2")
    import export_models_cli

    model, _ = export_models_cli.mlp()
    x = torch.randn(5, 8)
    torch.testing.assert_close(loaded.module()(x), model(x))


def test_export_json_reports_the_verdict_and_the_steps(workdir: Path) -> None:
    result = CliRunner().invoke(main, ["export", "export", "--model", "export_models_cli:mlp", "-o", "m.pt2", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0
    payload = json.loads(result.stdout)
    assert (payload["ok"], payload["package"], payload["out"], payload["pipeline"]) == (True, False, "m.pt2", "export")
    assert [step["id"] for step in payload["report"]["steps"]] == ["functionalize", "decompose", "fx.cse", "fx.dce"]


@pytest.mark.slow
def test_export_package_writes_an_aotinductor_package_that_matches_eager(workdir: Path) -> None:
    result = _invoke("export", "export", "--model", "export_models_cli:mlp", "-o", "mlp-package.pt2", "--package")
    assert result.exit_code == 0, result.output
    assert "the package mlp-package.pt2 vs eager" in result.output.splitlines()[-1]
    metadata = torch._inductor.aoti_load_package(str(workdir / "mlp-package.pt2")).get_metadata()
    assert metadata["passkit.pipeline"] == "export"


def test_export_with_a_training_pipeline_is_one_line_and_exit_2(workdir: Path) -> None:
    result = _invoke("export", "training", "--model", "export_models_cli:mlp", "-o", "m.pt2")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "passkit/pipelines/training.toml: steps[4] (joint): 'joint' makes a joint graph, which an exported program "
        "cannot hold; passkit.export runs a pipeline with kind = \"export\" (no joint, partition or codegen step), "
        "such as 'export'"
    )
    assert not (workdir / "m.pt2").exists()


def test_a_dynamic_dimension_that_is_not_a_number_is_one_line_and_exit_2(workdir: Path) -> None:
    result = _invoke("export", "export", "--model", "export_models_cli:mlp", "-o", "m.pt2", "--dynamic", "batch")
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == "--dynamic takes a dimension number, not 'batch'"


def test_a_dynamic_dimension_an_input_lacks_names_the_input_and_its_rank(workdir: Path) -> None:
    for dim, message in (
        ("5", "--dynamic 5: input 'input' has rank 2, so dimensions 0 to 1 (or -2 to -1)"),
        ("-3", "--dynamic -3: input 'input' has rank 2, so dimensions 0 to 1 (or -2 to -1)"),
    ):
        result = CliRunner().invoke(main, ["export", "export", "--model", "export_models_cli:mlp", "-o", "m.pt2",
                                           "--dynamic", dim])
        assert (result.exit_code, result.stderr) == (2, message + "\n")
        assert not (workdir / "m.pt2").exists()


def test_a_negative_dynamic_dimension_counts_from_the_end(workdir: Path) -> None:
    result = _invoke("export", "export", "--model", "export_models_cli:mlp", "-o", "m.pt2", "--dynamic", "-2")
    assert result.exit_code == 0, result.output
    loaded = torch.export.load(workdir / "m.pt2")
    import export_models_cli

    model, (x,) = export_models_cli.mlp()
    theirs = torch.export.export(model, (x,), dynamic_shapes={"input": {0: torch.export.Dim("batch")}})
    assert str(loaded.range_constraints) == str(theirs.range_constraints)  # torch's own: dim 0 is dynamic
    bigger = torch.randn(7, 8)
    torch.testing.assert_close(loaded.module()(bigger), model(bigger))
