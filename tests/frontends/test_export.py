"""``passkit.export`` and ``passkit.package``: real models exported through a pipeline, saved and
loaded, compiled into AOTInductor packages and run from them, equal to eager; what torch's own
Core ATen export does on the same models; the one-line refusals."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import passkit
from export_models import MODELS, Deployed, leaves
from passkit.errors import PasskitError, PipelineError

PLUGIN_PIPELINE = """
[pipeline]
name = "export-scaled"
extends = "export"

[[steps]]
pass = "acme.scaled_outputs"
after = "fx.dce"
"""


@passkit.graph_pass("acme.scaled_outputs", requires={"functional"})
def scaled_outputs(program: passkit.Program) -> bool:
    """Multiply each floating user output by a buffer the pass adds (1.0: numerics unchanged)."""
    gm, io = program.graphs["main"], program.io("main")
    gm.register_buffer("acme_scale", torch.ones(()))
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = list(output.args[0])
    with gm.graph.inserting_before(output):
        scale = gm.graph.get_attr("acme_scale")
        scale.meta["val"] = program.fake_mode.from_tensor(torch.ones(()))
        for k, (value, desc) in enumerate(zip(values, io.outputs)):
            fake = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
            if desc.kind == "user" and isinstance(fake, torch.Tensor) and fake.is_floating_point():
                values[k] = gm.graph.call_function(torch.ops.aten.mul.Tensor, (value, scale))
                with program.fake_mode:
                    values[k].meta["val"] = torch.ops.aten.mul.Tensor(fake, scale.meta["val"])
    output.args = (tuple(values),)
    gm.recompile()
    return True


class AcmePlugin:
    @passkit.hookimpl
    def passkit_register_passes(self) -> list:
        return [scaled_outputs]


@pytest.fixture
def plugin_pipeline(tmp_path: Path, register_passkit_plugin: Any) -> str:
    register_passkit_plugin(AcmePlugin(), name="acme")
    path = tmp_path / "export-scaled.toml"
    path.write_text(PLUGIN_PIPELINE)
    return str(path)


def core_aten_violations(exported: torch.export.ExportedProgram) -> set[str]:
    """ATen ops outside Core ATen; run-time assertions (no results, such as
    ``_assert_tensor_metadata``) are allowed, as torch's own Core ATen export keeps them."""
    return {
        str(node.target) for node in exported.graph.nodes
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
        and node.target.namespace == "aten" and torch.Tag.core not in node.target.tags
        and len(node.target._schema.returns) > 0
    }


def _eager(deployed: Deployed, model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    with torch.no_grad():
        return leaves(model(*args, **kwargs))


def _assert_equal(got: Any, expected: Any) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _export(name: str, pipeline: str, **settings: Any) -> tuple[torch.nn.Module, Any]:
    deployed = MODELS[name]
    torch.manual_seed(0)
    model = deployed.build()
    exported = passkit.export(copy.deepcopy(model), deployed.args, deployed.kwargs, pipeline=pipeline,
                              dynamic_shapes=deployed.dynamic_shapes, **settings)
    return model, exported


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["export", "plugin"])
@pytest.mark.parametrize("name", list(MODELS))
def test_a_model_exported_saved_loaded_and_packaged_equals_eager(name: str, pipeline: str, plugin_pipeline: str,
                                                                   tmp_path: Path) -> None:
    deployed = MODELS[name]
    model, exported = _export(name, plugin_pipeline if pipeline == "plugin" else "export")
    assert core_aten_violations(exported) == set()
    assert {"functional", "decomposed"} <= set(exported.passkit_export["facts"])
    if pipeline == "plugin":
        assert "acme_scale" in exported.state_dict
        assert [r.id for r in exported.passkit_report.records][-1] == "acme.scaled_outputs"

    torch.export.save(exported, tmp_path / "model.pt2")
    loaded = torch.export.load(tmp_path / "model.pt2")
    package = passkit.package(loaded, tmp_path / "package.pt2")
    runner = torch._inductor.aoti_load_package(package)
    for args, kwargs in deployed.checks:
        reference, from_export, from_loaded = copy.deepcopy(model), copy.deepcopy(exported.module()), loaded.module()
        expected = _eager(deployed, reference, args, kwargs)
        _assert_equal(_eager(deployed, from_export, args, kwargs), expected)
        _assert_equal(_eager(deployed, from_loaded, args, kwargs), expected)
        _assert_equal(leaves(runner(*args, **kwargs)), expected)
        # A training-mode BatchNorm's running statistics are outputs the module writes back.
        written = from_export.state_dict()
        for key, want in reference.state_dict().items():
            torch.testing.assert_close(written[key], want, msg=key)


def test_torchs_own_core_aten_export_of_gpt2_fails_where_passkits_runs() -> None:
    deployed = MODELS["gpt2"]
    torch.manual_seed(0)
    model = deployed.build()
    with pytest.raises(Exception, match="Cannot view a tensor with shape"):
        torch.export.export(model, (), deployed.kwargs).run_decompositions()
    _, exported = _export("gpt2", "export")
    ops = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" not in ops
    assert core_aten_violations(exported) == set()


def test_the_exported_signature_names_buffer_writes_and_the_package_records_the_pipeline(tmp_path: Path) -> None:
    model, exported = _export("batchnorm_train", "export")
    mutations = {spec.target for spec in exported.graph_signature.output_specs if spec.kind.name == "BUFFER_MUTATION"}
    assert mutations == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    metadata = torch._inductor.aoti_load_package(passkit.package(exported, tmp_path / "bn.pt2")).get_metadata()
    assert metadata["passkit.pipeline"] == "export"
    assert metadata["passkit.fingerprint"] == passkit.load_pipeline("export").fingerprint()
    assert metadata["passkit.version"] == passkit.__version__


def test_a_second_export_of_the_same_model_loads_from_the_compile_cache() -> None:
    _, first = _export("dynamic_batch", "export")
    _, second = _export("dynamic_batch", "export")
    assert (first.passkit_report.cache, second.passkit_report.cache) == ("miss", "hit")
    assert str(first.graph_module.code) == str(second.graph_module.code)
    x = MODELS["dynamic_batch"].checks[1][0][0]
    torch.testing.assert_close(second.module()(x), first.module()(x))


def test_verify_numerics_dumps_and_the_html_report_work_on_the_export_path(tmp_path: Path) -> None:
    _, exported = _export("batchnorm_eval", "export", verify="numerics", dump="changed", dump_dir=str(tmp_path / "dump"),
                          report=str(tmp_path / "run.html"))
    report = exported.passkit_report
    assert [r.status for r in report.records] == ["ran"] * 4
    dumped = sorted(p.name for p in (tmp_path / "dump" / "graph-1").iterdir())
    assert dumped[0] == "00-captured-main.py" and any(name.startswith("01-functionalize") for name in dumped)
    assert "decompose" in (tmp_path / "run.html").read_text()


def test_a_pipeline_that_generates_code_is_refused_for_export_naming_the_step() -> None:
    model = MODELS["dynamic_batch"].build()
    with pytest.raises(PipelineError) as info:
        passkit.export(model, MODELS["dynamic_batch"].args, pipeline="inference-python")
    assert str(info.value) == (
        "passkit/pipelines/inference-python.toml: steps[4] (codegen.python): 'codegen.python' generates code, which an exported "
        "program cannot hold; passkit.export runs a pipeline with kind = \"export\" (no joint, partition or "
        "codegen step), such as 'export'"
    )


def test_an_export_pipeline_file_with_a_joint_step_is_refused_when_it_loads(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[pipeline]\nkind = "export"\n\n[[steps]]\npass = "functionalize"\n\n[[steps]]\npass = "joint"\n')
    with pytest.raises(PipelineError) as info:
        passkit.load_pipeline(str(path))
    assert str(info.value).startswith(f"{path}: steps[1] (joint): 'joint' makes a joint graph, which an exported program")


def test_a_dict_pipeline_extending_export_with_a_joint_step_is_told_the_step_is_the_problem() -> None:
    dict_pipeline = {"pipeline": {"name": "x", "extends": "export"}, "steps": [{"pass": "joint", "after": "decompose"}]}
    line = sys._getframe().f_lineno + 2  # the call's line names a dict pipeline
    with pytest.raises(PipelineError) as info:
        passkit.export(MODELS["dynamic_batch"].build(), MODELS["dynamic_batch"].args, pipeline=dict_pipeline)
    assert str(info.value) == (
        f"{__file__}:{line}: steps[0] (joint): 'joint' makes a joint graph, which an exported program cannot "
        "hold; an export pipeline (kind = \"export\") has no joint, partition or codegen step: remove this one, or "
        "export with passkit.export and train with passkit.compile"
    )


def test_a_program_decomposed_with_a_table_inductor_does_not_take_is_refused_by_package(tmp_path: Path) -> None:
    path = tmp_path / "full.toml"
    path.write_text('[pipeline]\nname = "export-full"\nextends = "export"\n\n[override.decompose]\ntables = ["full"]\n')
    _, exported = _export("dynamic_batch", str(path))
    with pytest.raises(PasskitError) as info:
        passkit.package(exported, tmp_path / "p.pt2")
    assert str(info.value) == (
        "passkit.package: the program was decomposed with table 'full' (export-full), which Inductor does not "
        "take as input; export it with core_aten or inductor"
    )
    assert not (tmp_path / "p.pt2").exists()


def test_a_failing_export_step_writes_a_reproducer_that_replays_without_the_model(tmp_path: Path, monkeypatch: Any,
                                                                                  register_passkit_plugin: Any) -> None:
    import planted_bugs
    from passkit.core.plugins import get_plugin_manager
    from passkit.core.registry import get_registry
    from passkit.debug.replay import replay

    monkeypatch.chdir(tmp_path)
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    (tmp_path / "planted.toml").write_text(
        '[pipeline]\nname = "planted"\nextends = "export"\n\n[[steps]]\npass = "planted.explode"\nafter = "decompose"\n'
    )
    with pytest.raises(passkit.PassError) as info:
        passkit.export(MODELS["dynamic_batch"].build(), MODELS["dynamic_batch"].args, pipeline="planted.toml")
    assert str(info.value).startswith("planted.toml: steps[0] (planted.explode) failed: RuntimeError: planted failure")
    folder = tmp_path / "passkit-repro" / "03-planted.explode"
    assert str(info.value).endswith(f"(reproducer: {folder.relative_to(tmp_path)})")
    replayed = replay(folder, pm=get_plugin_manager(), registry=get_registry())
    assert (replayed.recorded_kind, replayed.kind) == ("crash", "crash")
    assert "planted failure" in replayed.message


def test_a_dict_pipeline_that_extends_export_runs_a_notebook_pass() -> None:
    seen = []

    @passkit.graph_pass("nb.count_outputs", requires={"functional"})
    def count_outputs(program: passkit.Program) -> bool:
        """Count main's outputs."""
        seen.append(len(program.io("main").outputs))
        return False

    model = MODELS["batchnorm_train"].build()
    pipeline = {"pipeline": {"name": "nb-export", "extends": "export"}, "steps": [{"pass": count_outputs, "after": "fx.dce"}]}
    exported = passkit.export(copy.deepcopy(model), MODELS["batchnorm_train"].args, pipeline=pipeline, cache="off")
    assert seen == [4]  # three running statistics written back, then the user output
    assert exported.passkit_export["pipeline"] == "nb-export"
    x = MODELS["batchnorm_train"].args[0]
    torch.testing.assert_close(exported.module()(x), model(x))


@pytest.mark.slow
def test_a_package_runs_a_mounted_files_slot_steps_inside_its_compile(tmp_path: Path) -> None:
    model, exported = _export("llama", "export")
    before = len(passkit.reports())
    package = passkit.package(exported, tmp_path / "llama.pt2", pipeline="inductor-post-grad")
    slot_reports = passkit.reports()[before:]
    assert {r.pipeline for r in slot_reports} == {"inductor-post-grad"}
    assert any(record.id == "gemm" and record.status == "ran" for r in slot_reports for record in r.records)
    runner = torch._inductor.aoti_load_package(package)
    metadata = runner.get_metadata()
    assert (metadata["passkit.pipeline"], metadata["passkit.export_pipeline"]) == ("inductor-post-grad", "export")
    assert metadata["passkit.fingerprint"] == passkit.load_pipeline("inductor-post-grad").fingerprint()
    ((args, kwargs),) = MODELS["llama"].checks
    _assert_equal(leaves(runner(*args, **kwargs)), _eager(MODELS["llama"], model, args, kwargs))


def test_what_export_and_package_are_handed_is_checked_in_one_line() -> None:
    with pytest.raises(PasskitError) as not_a_module:
        passkit.export(lambda x: x + 1, (torch.randn(2),))
    assert str(not_a_module.value) == "passkit.export: expected an nn.Module, got function"
    with pytest.raises(PasskitError) as not_a_program:
        passkit.package(torch.nn.Linear(2, 2), "p.pt2")
    assert str(not_a_program.value) == "passkit.package: expected an ExportedProgram, got Linear"


def test_a_program_torch_already_decomposed_is_refused_in_one_line() -> None:
    from passkit.frontends.export import export_program, resolve_export_pipeline

    model = MODELS["batchnorm_train"].build()
    decomposed = torch.export.export(model, MODELS["batchnorm_train"].args).run_decompositions()
    with pytest.raises(PasskitError) as info:
        export_program(decomposed, resolve_export_pipeline("export", {}))
    assert str(info.value) == (
        "passkit.export: the captured program already has BUFFER_MUTATION outputs; export it with "
        "torch.export.export and pass that model, not a decomposed program"
    )
