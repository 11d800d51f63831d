"""``passkit.to_executorch``: real models lowered through the ``edge`` pipeline into a ``.pte``,
run on the ExecuTorch runtime in this process and compared with eager; torch's own ExecuTorch
flow on the same models; a plugin pass placed in an edge pipeline, and ``bisect`` naming it
when it is wrong; the tools every pipeline has (verify, dumps, HTML report, compile cache).

ExecuTorch is optional (``pip install "passkit[executorch]"``): without it these tests skip,
except in CI, where they fail."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

import passkit
from dependencies import require_module
from export_models import MODELS, MLP, leaves

require_module("executorch.runtime", install='pip install "passkit[executorch]"')

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: E402
from executorch.exir import to_edge_transform_and_lower  # noqa: E402
from executorch.runtime import Runtime  # noqa: E402

from passkit import _torch  # noqa: E402
from passkit.frontends.executorch import pte_record, with_partitioners  # noqa: E402

def _on_runtime(path: str | Path, exported: torch.export.ExportedProgram, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The ``.pte`` at ``path`` run on the ExecuTorch runtime (``executorch.runtime``). The program
    stays referenced while its method runs (the method reads its memory)."""
    program = Runtime.get().load_program(Path(path).read_bytes())
    outputs = list(program.load_method("forward").execute(_torch.flat_user_inputs(exported, args, kwargs)))
    del program
    return outputs


def _equal_to_eager(got: list[Any], model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with torch.no_grad():
        expected = leaves(model(*args, **kwargs))
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _torchvision(name: str) -> Any:
    """torchvision's model ``name``; skipped, in CI too, where torchvision cannot be imported beside
    this torch: PyPI's torchvision wheels are built against PyPI's torch, and a CPU-only torch
    (``2.13.0+cpu``) lacks the operators their library registers ("operator torchvision::nms
    does not exist")."""
    try:
        import torchvision.models as models
    except Exception as exc:  # noqa: BLE001 - ImportError, or the RuntimeError of a mismatched build
        pytest.skip(f"torchvision does not import beside torch {torch.__version__}: {str(exc).splitlines()[0]}")
    return lambda: getattr(models, name)().eval()


def _images(batch: int, size: int) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))


# Each model at its defaults; torchvision's take images smaller than ImageNet's to keep the
# test short (the networks are the same).
DEVICE_MODELS = {
    "mlp": lambda: (MLP().eval(), (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),), {}),
    "conv_bn": lambda: (MODELS["batchnorm_eval"].build(), MODELS["batchnorm_eval"].args, {}),
    "mobilenet_v3": lambda: (_torchvision("mobilenet_v3_small")(), (_images(1, 64),), {}),
    "resnet18": lambda: (_torchvision("resnet18")(), (_images(1, 64),), {}),
    "gpt2": lambda: (MODELS["gpt2"].build(), (), dict(MODELS["gpt2"].kwargs)),
    "llama": lambda: (MODELS["llama"].build(), (), dict(MODELS["llama"].kwargs)),
}


@pytest.mark.slow
@pytest.mark.parametrize("partitioners", [("xnnpack",), ()], ids=["xnnpack", "portable"])
@pytest.mark.parametrize("name", list(DEVICE_MODELS))
def test_a_model_runs_from_a_pte_on_the_executorch_runtime_equal_to_eager(name: str, partitioners: tuple[str, ...],
                                                                           tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, args, kwargs = DEVICE_MODELS[name]()
    exported = passkit.export(copy.deepcopy(model), args, kwargs)
    path = passkit.to_executorch(exported, tmp_path / f"{name}.pte", partitioners=partitioners, verify="numerics")
    report = passkit.reports()[-1]
    assert [record.id for record in report.records][-3:] == ["edge.lower", "edge.contiguous", "edge.delegate"]
    assert report.records[-1].changed == bool(partitioners)
    _equal_to_eager(_on_runtime(path, exported, args, kwargs), model, args, kwargs)
    fingerprint = with_partitioners(passkit.load_pipeline("edge"), partitioners).fingerprint()
    assert pte_record(path) == {"passkit_pipeline": "edge", "passkit_fingerprint": fingerprint,
                                "passkit_version": passkit.__version__, "passkit_export_pipeline": "export"}


@pytest.mark.slow
def test_torchs_own_flow_fails_on_gpt2_where_passkits_runs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, args, kwargs = DEVICE_MODELS["gpt2"]()
    captured = torch.export.export(copy.deepcopy(model), args, kwargs)
    # torch's own flow: ExecuTorch's lowering of torch.export's program, delegated to XNNPACK.
    # torch's SDPA decomposition lays the attention's output out for another permute than the
    # graph's next view expects (see docs/export.md).
    with pytest.raises(Exception) as failure:
        to_edge_transform_and_lower(captured, partitioner=[XnnpackPartitioner()])
    assert str(failure.value).startswith(
        "Cannot view a tensor with shape torch.Size([2, 12, 32]) and strides (32, 64, 1) as a tensor with shape (24, 32)!"
    )
    # passkit's flow, from passkit.export and from the same program torch.export made.
    exported = passkit.export(copy.deepcopy(model), args, kwargs)
    for program in (exported, captured):
        path = passkit.to_executorch(program, tmp_path / "gpt2.pte")
        _equal_to_eager(_on_runtime(path, program, args, kwargs), model, args, kwargs)


@pytest.mark.slow
def test_a_dynamic_batch_runs_at_other_sizes_from_one_pte(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    batch = torch.export.Dim("batch", min=1, max=16)  # ExecuTorch plans memory for the largest size
    exported = passkit.export(copy.deepcopy(model), (torch.randn(4, 8),), dynamic_shapes=({0: batch},))
    path = passkit.to_executorch(exported, tmp_path / "dynamic.pte")
    for size in (4, 7, 16, 1):
        x = torch.randn(size, 8, generator=torch.Generator().manual_seed(size))
        _equal_to_eager(_on_runtime(path, exported, (x,), {}), model, (x,), {})


SCALE_PIPELINE = """
[pipeline]
name = "edge-scaled"
extends = "edge"

[[steps]]
pass = "acme.scaled_outputs"
after = "fx.dce"
"""

WRONG_PIPELINE = """
[pipeline]
name = "edge-wrong"
extends = "edge"

[[steps]]
pass = "acme.drop_bias"
after = "edge.lower"
"""


@passkit.graph_pass("acme.drop_bias", requires={"edge"})
def drop_bias(program: passkit.Program) -> bool:
    """A planted bug on the Edge dialect: every Edge ``addmm`` (a linear layer) loses its bias."""
    from executorch.exir.dialects._ops import ops as exir_ops

    changed = False
    for node in program.graphs["main"].graph.nodes:
        if node.op == "call_function" and node.target is exir_ops.edge.aten.addmm.default:
            node.target, node.args = exir_ops.edge.aten.mm.default, tuple(node.args[1:3])
            changed = True
    program.graphs["main"].recompile()
    return changed


class AcmeEdgePlugin:
    @passkit.hookimpl
    def passkit_register_passes(self) -> list:
        from test_export import scaled_outputs

        return [scaled_outputs, drop_bias]


@pytest.fixture
def acme(tmp_path: Path, register_passkit_plugin: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    register_passkit_plugin(AcmeEdgePlugin(), name="acme")
    (tmp_path / "edge-scaled.toml").write_text(SCALE_PIPELINE)
    (tmp_path / "edge-wrong.toml").write_text(WRONG_PIPELINE)
    (tmp_path / "edge_models.py").write_text(
        "import torch\nfrom export_models import MLP\n\n"
        "def mlp():\n    torch.manual_seed(0)\n    return MLP().eval(), (torch.randn(4, 8),)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.slow
def test_a_plugin_pass_in_an_edge_pipeline_changes_the_pte_and_bisect_names_it_when_wrong(acme: Path) -> None:
    from click.testing import CliRunner

    from passkit.cli import main

    torch.manual_seed(0)
    model, args, _ = DEVICE_MODELS["mlp"]()
    exported = passkit.export(copy.deepcopy(model), args)
    plain = Path(passkit.to_executorch(exported, acme / "plain.pte", partitioners=()))
    # The export pipeline's pass, unchanged, placed before the Edge lowering: a new buffer and a
    # multiplication by it in the program, so the file changes; the values do not (scale 1).
    scaled = Path(passkit.to_executorch(exported, acme / "scaled.pte", pipeline="edge-scaled.toml", partitioners=(),
                                        verify="numerics"))
    assert "acme.scaled_outputs" in [record.id for record in passkit.reports()[-1].records]
    assert scaled.read_bytes() != plain.read_bytes()
    assert len(scaled.read_bytes()) > len(plain.read_bytes())
    assert pte_record(scaled)["passkit_pipeline"] == "edge-scaled"
    _equal_to_eager(_on_runtime(scaled, exported, args, {}), model, args, {})
    # A wrong pass on the Edge dialect: the .pte computes something else, and bisect names it.
    wrong = passkit.to_executorch(exported, acme / "wrong.pte", pipeline="edge-wrong.toml", partitioners=())
    got = _on_runtime(wrong, exported, args, {})[0]
    assert not torch.allclose(got, model(*args))
    result = CliRunner().invoke(main, ["bisect", "edge-wrong.toml", "--model", "edge_models:mlp", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["first_bad_step"]["id"] == "acme.drop_bias"


@pytest.mark.slow
def test_verify_dumps_the_html_report_and_the_compile_cache_work_on_the_edge_path(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, args, _ = DEVICE_MODELS["conv_bn"]()
    exported = passkit.export(copy.deepcopy(model), args)
    first = passkit.to_executorch(exported, tmp_path / "a.pte", verify="numerics", dump="all",
                                  dump_dir=str(tmp_path / "dump"), report=str(tmp_path / "run.html"))
    assert passkit.reports()[-1].cache != "hit"
    dumped = sorted(path.name for path in (tmp_path / "dump" / "graph-1").iterdir())
    assert any("edge.lower" in name for name in dumped) and any("edge.delegate" in name for name in dumped), dumped
    assert "edge.delegate" in (tmp_path / "run.html").read_text()
    second = passkit.to_executorch(exported, tmp_path / "b.pte")
    assert passkit.reports()[-1].cache == "hit"
    assert Path(second).read_bytes() == Path(first).read_bytes()
    _equal_to_eager(_on_runtime(second, exported, args, {}), model, args, {})


def test_what_to_executorch_is_handed_is_checked_in_one_line(tmp_path: Path) -> None:
    exported = passkit.export(MLP().eval(), (torch.randn(2, 8),))
    with pytest.raises(passkit.PasskitError) as info:
        passkit.to_executorch(MLP(), tmp_path / "m.pte")
    assert str(info.value) == "passkit.to_executorch: expected an ExportedProgram, got MLP"
    with pytest.raises(passkit.PasskitError) as info:
        passkit.to_executorch(exported, tmp_path / "m.pte", pipeline="export")
    assert str(info.value).endswith(
        "export.toml: passkit.to_executorch runs a pipeline with kind = \"edge\" (it lowers to ExecuTorch), "
        "such as 'edge', or one that extends it; this one is kind = 'export'"
    )
    with pytest.raises(passkit.PasskitError) as info:
        passkit.to_executorch(exported, tmp_path / "m.pte", partitioners=("coreml",))
    assert str(info.value) == "passkit.to_executorch: unknown partitioner 'coreml'; passkit knows xnnpack"
    with pytest.raises(passkit.PasskitError) as info:
        passkit.export(MLP().eval(), (torch.randn(2, 8),), pipeline="edge")
    assert "an edge pipeline (kind = \"edge\") lowers to ExecuTorch" in str(info.value)
    assert not (tmp_path / "m.pte").exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_cli_writes_a_pte_runs_it_on_the_runtime_and_records_the_pipeline_beside_it(name: str, tmp_path: Path,
                                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from passkit.cli import main

    module = f"device_models_{name}"  # one module per model: Python keeps the first one imported
    (tmp_path / f"{module}.py").write_text(
        "from export_models import MODELS\n\n"
        f"def {name}():\n    return MODELS[{name!r}].build(), (dict(MODELS[{name!r}].kwargs),)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(main, ["export", "edge", "--model", f"{module}:{name}", "-o", f"out/{name}.pte",
                                       "--executorch", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert (payload["ok"], payload["executorch"], payload["out"], payload["pipeline"]) == (True, True, f"out/{name}.pte", "edge")
    assert [step["id"] for step in payload["report"]["steps"]][-3:] == ["edge.lower", "edge.contiguous", "edge.delegate"]
    assert result.stderr.splitlines()[-1].startswith(
        f"ok: edge on {module}:{name}: the ExecuTorch program out/{name}.pte vs eager: outputs max |diff| "
    )
    sidecar = json.loads((tmp_path / "out" / f"{name}.pte.json").read_text())
    assert sidecar["record"] == pte_record(tmp_path / "out" / f"{name}.pte")
    assert sidecar["record"]["passkit_pipeline"] == "edge" and sidecar["ok"] is True


def test_explain_says_which_dialect_each_step_of_an_edge_pipeline_sees() -> None:
    from passkit.pipeline.explain import explain_text

    text = explain_text(passkit.load_pipeline("edge"))
    assert "kind: edge (passkit.to_executorch writes the program as an ExecuTorch .pte)" in text
    assert "  fx.dce: ATen (as in an export pipeline)\n" in text
    assert "  edge.lower: ATen (as in an export pipeline)\n" in text
    assert "  edge.delegate: Edge ops (exir_ops.edge.aten.*; a pass matching torch.ops.aten targets finds none)\n" in text
