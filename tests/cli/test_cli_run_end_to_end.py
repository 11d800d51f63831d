"""`passkit run` for real: a model factory from the command line, dumps, JSON, failures."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from passkit.cli import main

MODELS = textwrap.dedent(
    '''
    import torch

    def tiny():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)), (torch.randn(3, 4),)

    def frozen():
        model, inputs = tiny()
        for p in model.parameters():
            p.requires_grad_(False)
        return model, inputs

    def not_a_pair():
        return 42
    '''
)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "tiny_models.py").write_text(MODELS)
    return tmp_path


def passkit(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "passkit", *args], cwd=workdir, capture_output=True, text=True, timeout=300
    )


def test_run_trains_a_model_from_the_command_line_and_dumps_each_step(workdir: Path) -> None:
    result = passkit(workdir, "run", "training-python", "--model", "tiny_models:tiny", "--dump", "out", "--json", "result.json")
    assert result.returncode == 0, result.stderr
    assert "ok: " in result.stdout + result.stderr
    assert "(training) vs eager" in result.stdout + result.stderr
    assert [p.name for p in (workdir / "out").iterdir()] == ["compile-0_0"]  # Dynamo's first frame, first compile
    dumped = sorted(p.name for p in (workdir / "out" / "compile-0_0").iterdir())
    assert "00-captured-main.py" in dumped
    assert "11-codegen.python-backward.py" in dumped
    codegen = (workdir / "out" / "compile-0_0" / "11-codegen.python-backward.py").read_text()
    assert codegen.splitlines()[1].endswith(", generated code")
    data = json.loads((workdir / "result.json").read_text())
    assert data["ok"] is True and data["training"] is True
    assert [s["id"] for s in data["reports"][0]["steps"]][:4] == ["functionalize", "decompose", "attention", "joint"]


def test_run_without_trainable_parameters_is_an_inference_step(workdir: Path) -> None:
    result = passkit(workdir, "run", "training-python", "--model", "tiny_models:frozen")
    assert result.returncode == 0, result.stderr
    assert "(inference) vs eager" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("tiny_models", "--model must look like 'package.module:factory', not 'tiny_models'"),
        ("nope_models:tiny", "--model nope_models:tiny: cannot import 'nope_models': No module named 'nope_models'"),
        ("tiny_models:missing", "--model tiny_models:missing: 'tiny_models' has no callable 'missing'"),
        ("tiny_models:not_a_pair", "--model tiny_models:not_a_pair: the factory must return (module, example_inputs)"),
    ],
)
def test_bad_models_are_one_line_errors(workdir: Path, model: str, message: str) -> None:
    result = passkit(workdir, "run", "training-python", "--model", model)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in result.stderr


def test_a_second_decompose_after_joint_is_legal(workdir: Path) -> None:
    (workdir / "twice.toml").write_text(
        '[pipeline]\nname = "twice"\nextends = "training-python"\n\n[[steps]]\npass = "decompose"\nid = "again"\n'
        'after = "joint"\nkeep = ["aten.gelu.default"]\n'
    )
    result = passkit(workdir, "run", "twice.toml", "--model", "tiny_models:tiny")
    assert result.returncode == 0, result.stderr


def test_a_missing_fact_is_one_line_and_exit_2(workdir: Path) -> None:
    (workdir / "order.toml").write_text(
        '[[steps]]\npass = "functionalize"\n\n[[steps]]\npass = "partition.default"\n\n'
        '[[steps]]\npass = "joint"\n\n[[steps]]\npass = "codegen.python"\n'
    )
    result = passkit(workdir, "run", "order.toml", "--model", "tiny_models:tiny")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "order.toml: steps[1] (partition.default): requires fact 'joint', which no earlier step produces; "
        "add a 'joint' step before it"
    )


BAD_PLUGIN = textwrap.dedent(
    '''
    import torch
    import passkit

    @passkit.graph_pass("planted.gelu_to_relu", requires={"partitioned"})
    def gelu_to_relu(program):
        """Miscompile on purpose: GELU in the forward becomes ReLU."""
        gm = program.graphs["forward"]
        for node in gm.graph.nodes:
            if node.target is torch.ops.aten.gelu.default:
                node.target, node.args, node.kwargs = torch.ops.aten.relu.default, node.args[:1], {}
        gm.recompile()
        return True

    @passkit.hookimpl
    def passkit_register_passes():
        return [gelu_to_relu]
    '''
)


def test_a_planted_miscompile_is_a_mismatch_and_exit_1(workdir: Path) -> None:
    dist_info = workdir / "planted-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: planted\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[passkit]\nplanted = planted_passes\n")
    (workdir / "planted_passes.py").write_text(BAD_PLUGIN)
    (workdir / "bad.toml").write_text(
        '[pipeline]\nextends = "training-python"\n\n[[steps]]\npass = "planted.gelu_to_relu"\nafter = "partition.default"\n'
    )
    result = passkit(workdir, "run", "bad.toml", "--model", "tiny_models:tiny", "--json", "result.json")
    assert result.returncode == 1, result.stderr
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.startswith("MISMATCH: bad.toml on tiny_models:tiny (training) vs eager: outputs max |diff| ")
    assert "; first mismatch: output[0]: max |diff| " in verdict
    data = json.loads((workdir / "result.json").read_text())
    assert data["ok"] is False and data["mismatches"][0].startswith("output[0]: max |diff| ")


@pytest.mark.slow
def test_a_folder_named_like_an_installed_plugin_does_not_shadow_it(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, as the ``passkit`` script runs (``python -m`` itself puts the folder first)."""
    pytest.importorskip("passkit_example")
    for name in [name for name in sys.modules if name.split(".")[0] == "passkit_example"]:
        monkeypatch.delitem(sys.modules, name)  # so the run imports the plugin afresh
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(workdir)
    (workdir / "passkit_example").mkdir()
    (workdir / "passkit_example" / "__init__.py").write_text('"""Not the plugin: a folder that shares its name."""\n')
    result = CliRunner().invoke(main, ["run", "training-gelu-tanh", "--model", "tiny_models:tiny"])
    assert result.exit_code == 0, result.output
    plugin = sys.modules["passkit_example"]
    assert Path(plugin.__file__).parent != workdir / "passkit_example"
    shipped = re.escape(str(plugin.PIPELINES_DIR / "training-gelu-tanh.toml"))
    assert re.fullmatch(
        rf"ok: {shipped} on tiny_models:tiny \(training\) vs eager: outputs max \|diff\| \d\.\de-\d\d, "
        r"grads max \|diff\| \d\.\de-\d\d \(rtol 0\.001, atol 0\.005\)",
        result.stdout.splitlines()[-1],
    ), result.stdout.splitlines()[-1]
    assert sys.path[-1] == str(workdir)  # the model came from here, looked up after the installed packages
