"""verify = "numerics" names the first deviating step; training needs joint; on_error = eager."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import passkit
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass


@graph_pass("test.mul_to_add", requires={"functional"})
def mul_to_add(program, *, graph: str = "") -> bool:
    """Miscompile on purpose: every multiplication (in one graph, or all) becomes an addition."""
    changed = False
    for name, gm in program.graphs.items():
        if graph and name != graph:
            continue
        for node in gm.graph.nodes:
            if node.target is torch.ops.aten.mul.Tensor:
                node.target = torch.ops.aten.add.Tensor
                changed = True
        gm.recompile()
    return changed


class _BadPlugin:
    @hookimpl
    def passkit_register_passes(self):
        return [mul_to_add]


@pytest.fixture
def bad_pass_registered(register_passkit_plugin):
    register_passkit_plugin(_BadPlugin(), name="test-bad-pass")


def _pipeline(tmp_path, extra: str, *, verify: str = "numerics") -> str:
    path = tmp_path / "bad.toml"
    path.write_text(
        f'[pipeline]\nname = "bad"\nextends = "training-python"\n\n[settings]\nverify = "{verify}"\n\n{extra}'
    )
    return str(path)


def test_numerics_verification_names_the_first_deviating_step(tmp_path, bad_pass_registered) -> None:
    pipeline = _pipeline(tmp_path, '[[steps]]\npass = "test.mul_to_add"\nafter = "partition.default"\n')
    repro = tmp_path / "repro"
    compiled = passkit.aot_function(lambda x, w: (x * w).sum(-1), pipeline=pipeline, repro_dir=str(repro))
    with pytest.raises(passkit.VerificationError) as info:
        compiled(torch.full((3, 4), 2.0), torch.full((4,), 3.0, requires_grad=True))
    # 2*3 summed over 4 columns is 24; 2+3 summed is 20.
    assert str(info.value) == (
        f"{pipeline}: steps[0] (test.mul_to_add) changed numerics: max |diff| 4 in output[0] of graph forward "
        f"(rtol 0.0001, atol 1e-05) (reproducer: {repro}/07-test.mul_to_add)"
    )


def test_numerics_verification_names_the_backward_when_only_gradients_deviate(tmp_path, bad_pass_registered) -> None:
    pipeline = _pipeline(
        tmp_path, '[[steps]]\npass = "test.mul_to_add"\nafter = "partition.default"\ngraph = "backward"\n'
    )
    repro = tmp_path / "repro"
    compiled = passkit.aot_function(lambda x, w: (x * w).sum(-1), pipeline=pipeline, repro_dir=str(repro))
    with pytest.raises(passkit.VerificationError) as info:
        compiled(torch.full((3, 4), 2.0), torch.full((4,), 3.0, requires_grad=True))
    message = str(info.value)
    assert message.startswith(f"{pipeline}: steps[0] (test.mul_to_add) changed numerics: max |diff| ")
    assert message.endswith(f" in grad[0] of graph backward (rtol 0.0001, atol 1e-05) (reproducer: {repro}/07-test.mul_to_add)")


SHIPPED = sorted(path.stem for path in (Path(passkit.__file__).parent / "pipelines").glob("*.toml"))
MOUNTED = ["inductor-post-grad"]  # its steps run in stock Inductor's slots (docs/inductor-slots.md)
EXPORTS = ["edge", "export"]  # passkit.to_executorch's and passkit.export's: no code to call (tests/frontends/test_export.py, test_executorch.py)


def test_the_shipped_pipelines_are_the_documented_ones() -> None:
    assert SHIPPED == ["debug", "edge", "export", "inductor-post-grad", "inference", "inference-python", "training", "training-python"]
    assert all(passkit.load_pipeline(name).mounted == (name in MOUNTED) for name in SHIPPED)
    assert all((passkit.load_pipeline(name).kind in ("export", "edge")) == (name in EXPORTS) for name in SHIPPED)


def test_an_export_pipeline_is_refused_where_code_is_compiled() -> None:
    with pytest.raises(passkit.PasskitError) as info:
        passkit.aot_function(lambda x: x.sin(), pipeline="export")(torch.randn(3))
    assert str(info.value) == (
        'passkit/pipelines/export.toml: an export pipeline (kind = "export") makes an ExportedProgram, not code to call; '
        "use passkit.export(model, args, pipeline='export'), or a pipeline that compiles, such as 'training'"
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in SHIPPED if name not in MOUNTED + EXPORTS])
def test_numerics_verification_passes_for_the_shipped_pipelines(name: str) -> None:
    pipeline = passkit.load_pipeline(name)
    compiled = passkit.aot_function(lambda x, w: (x @ w).softmax(-1), pipeline=pipeline, verify="numerics", dump="off")
    x, w = torch.randn(3, 4), torch.randn(4, 5, requires_grad=pipeline.can_train)
    with torch.set_grad_enabled(pipeline.can_train):
        out = compiled(x, w)
    torch.testing.assert_close(out, (x @ w).softmax(-1))
    (report,) = compiled.passkit_reports
    assert [r.status for r in report.records] == ["ran"] * len(pipeline.steps)  # every step, each verified
    assert report.records[-1].id.startswith("codegen.")


def test_a_training_program_without_joint_is_a_clear_error() -> None:
    compiled = passkit.aot_function(lambda x: x.sin(), pipeline="inference-python")
    with pytest.raises(passkit.PasskitError) as info:
        compiled(torch.randn(3, requires_grad=True))
    assert str(info.value) == passkit.load_pipeline("inference-python").label + (
        ": the program needs gradients but the pipeline has no 'joint' and 'partition' steps; "
        "use the 'training' pipeline, or call it under torch.no_grad()"
    )


def test_the_inference_pipeline_runs_under_no_grad() -> None:
    compiled = passkit.aot_function(lambda x: x.sin(), pipeline="inference-python")
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), x.sin())


def test_on_error_eager_warns_once_and_runs_uncompiled(tmp_path, register_passkit_plugin) -> None:
    @graph_pass("test.explode")
    def explode(program) -> bool:
        """Fail on purpose."""
        raise RuntimeError("boom")

    class Plugin:
        @hookimpl
        def passkit_register_passes(self):
            return [explode]

    register_passkit_plugin(Plugin(), name="test-explode")
    pipeline = _pipeline(tmp_path, '[[steps]]\npass = "test.explode"\nafter = "joint"\n', verify="off")
    repro = tmp_path / "repro"
    raising = passkit.aot_function(lambda x: x.cos(), pipeline=pipeline, repro_dir=str(repro))
    with pytest.raises(passkit.PassError) as info:
        raising(torch.randn(2, requires_grad=True))
    assert str(info.value) == (
        f"{pipeline}: steps[0] (test.explode) failed: RuntimeError: boom (after: functionalize, decompose, attention, joint) "
        f"(reproducer: {repro}/05-test.explode)"
    )
    eager = passkit.aot_function(lambda x: x.cos(), pipeline=pipeline, on_error="eager", repro_dir="")
    x = torch.randn(2, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="passkit: compiling failed, running eagerly: ") as warned:
        torch.testing.assert_close(eager(x), x.cos())
        torch.testing.assert_close(eager(x + 1), (x + 1).cos())
    assert len(warned) == 1


@graph_pass("test.drop_grad", requires={"partitioned"})
def drop_grad(program) -> bool:
    """Miscompile on purpose: the backward returns None for its first gradient."""
    gm = program.graphs["backward"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    output.args = ((None, *output.args[0][1:]),)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return True


class _DropGradPlugin:
    @hookimpl
    def passkit_register_passes(self):
        return [drop_grad]


def test_a_pass_that_drops_a_gradient_fails_numerics_verification(tmp_path, register_passkit_plugin) -> None:
    register_passkit_plugin(_DropGradPlugin(), name="test-drop-grad")
    pipeline = _pipeline(tmp_path, '[[steps]]\npass = "test.drop_grad"\nafter = "partition.default"\n')
    repro = tmp_path / "repro"
    compiled = passkit.aot_function(lambda x, w: (x * w).sum(-1), pipeline=pipeline, repro_dir=str(repro))
    with pytest.raises(passkit.VerificationError) as info:
        compiled(torch.full((3, 4), 2.0), torch.full((4,), 3.0, requires_grad=True))
    assert str(info.value) == (
        f"{pipeline}: steps[0] (test.drop_grad) changed numerics: "
        f"tensor (4,) torch.float32 vs None in grad[0] of graph backward (rtol 0.0001, atol 1e-05) "
        f"(reproducer: {repro}/07-test.drop_grad)"
    )
