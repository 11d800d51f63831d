"""The public entry points through Dynamo: the registered backend, backend(), compile()."""

from __future__ import annotations

import copy

import pytest
import torch

import passkit
from passkit.examples.transformer import MLP


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


def test_passkit_is_a_registered_dynamo_backend() -> None:
    assert "passkit" in torch._dynamo.list_backends(exclude_tags=())
    torch.manual_seed(0)
    model = MLP(8, 16)
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="passkit")
    x = torch.randn(4, 8)
    compiled(x).sum().backward()
    model(x).sum().backward()
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad)


def test_backend_object_takes_a_pipeline_and_settings(tmp_path) -> None:
    backend = passkit.backend("training-python", dump="changed", dump_dir=str(tmp_path / "dump"))
    compiled = torch.compile(lambda x: (x * 3).sin(), backend=backend)
    x = torch.randn(5, requires_grad=True)
    compiled(x).sum().backward()
    assert len(backend.reports) == 1
    (folder,) = (tmp_path / "dump").iterdir()  # one folder per compiled graph, named after Dynamo's compile id
    assert folder.name.startswith("compile-")
    dumped = sorted(p.name for p in folder.iterdir())
    assert "00-captured-main.py" in dumped
    assert any(name.endswith("-partition.default-forward.py") for name in dumped)
    assert any(name.endswith("-partition.default-backward.py") for name in dumped)
    backward = next(folder.glob("*-partition.default-backward.py")).read_text().splitlines()
    assert backward[2] == "# facts: captured, decomposed, functional, partitioned"
    assert backward[3].startswith("# inputs: saved[0], ") and backward[3].endswith("tangent[0]")
    assert backward[4] == "# outputs: grad[0]"


def test_a_bad_pipeline_fails_at_compile_time_with_one_line(tmp_path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[steps]]\npass = "fx.dcee"\n')
    with pytest.raises(passkit.PipelineError) as info:
        passkit.compile(lambda x: x, pipeline=str(path))
    assert str(info.value) == f"{path}: steps[0]: unknown pass 'fx.dcee'; did you mean 'fx.dce'?"


def test_graph_breaks_get_one_report_each() -> None:
    def fn(x):
        y = x.sin()
        print("graph break")
        return y.cos()

    compiled = passkit.compile(fn, pipeline="training-python")
    x = torch.randn(3, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, -torch.sin(x.sin()) * torch.cos(x))
    assert len(compiled.passkit_reports) == 2


def test_a_changing_size_compiles_once_statically_then_once_symbolically() -> None:
    compiled = torch.compile(lambda x: x.sin() * 2, backend="passkit")
    before = len(passkit.reports())
    for n in (3, 4, 5, 6):
        torch.testing.assert_close(compiled(torch.ones(n)), torch.ones(n).sin() * 2)
    assert len(passkit.reports()) - before == 2


def test_passkit_compile_with_dynamic_false_compiles_each_shape() -> None:
    compiled = passkit.compile(lambda x: x.sin() * 2, pipeline="training-python", dynamic=False)
    for n in (3, 4, 5):
        torch.testing.assert_close(compiled(torch.ones(n)), torch.ones(n).sin() * 2)
    assert len(compiled.passkit_reports) == 3


def test_passkit_compile_defaults_to_torch_compiles_dynamic_none() -> None:
    compiled = passkit.compile(lambda x: x.sin() * 2)
    for n in (3, 4, 5):
        torch.testing.assert_close(compiled(torch.ones(n)), torch.ones(n).sin() * 2)
    assert len(compiled.passkit_reports) == 2


def test_compiling_logs_one_numbered_line_per_step_on_the_passkit_logger(caplog, monkeypatch) -> None:
    import logging

    from passkit.core import progress
    monkeypatch.setattr(progress, "STARTED_AFTER_S", 3600.0)  # no "started" line on a loaded machine
    compiled = passkit.aot_function(lambda x: (x * 2).sin(), pipeline="inference-python")
    with caplog.at_level(logging.INFO, logger="passkit"), torch.no_grad():
        compiled(torch.randn(3))
    lines = [r.getMessage() for r in caplog.records if r.name == "passkit"]
    assert [line.split(":")[0] for line in lines] == [
        "[1/5] functionalize", "[2/5] decompose", "[3/5] fx.cse", "[4/5] fx.dce", "[5/5] codegen.python",
    ]
    assert lines[0].startswith("[1/5] functionalize: unchanged, ") and lines[0].endswith(" nodes")


def test_a_progress_callable_replaces_the_log_lines(caplog) -> None:
    import logging

    seen = []
    compiled = passkit.compile(lambda x: x.cos() + 1, pipeline="inference-python", progress=seen.append)
    with caplog.at_level(logging.INFO, logger="passkit"), torch.no_grad():
        compiled(torch.randn(3))
    assert [record.id for record in seen] == ["functionalize", "decompose", "fx.cse", "fx.dce", "codegen.python"]
    assert [r for r in caplog.records if r.name == "passkit"] == []


@pytest.mark.parametrize("front_end", ["compile", "aot_function"])
def test_a_first_call_under_saved_tensor_hooks_compiles_and_the_hooks_see_the_saved_tensors(front_end) -> None:
    # save_on_cpu-style hooks touch each tensor's storage: on the fakes a pass traces, that fails.
    torch.manual_seed(0)
    eager, x = MLP(), torch.randn(8, 64)
    model = copy.deepcopy(eager)
    params = dict(model.named_parameters())

    def loss_of(ps, x):
        return torch.func.functional_call(model, ps, (x,)).square().mean()

    step = (lambda: passkit.compile(model, pipeline="training-python")(x).square().mean()) if front_end == "compile" \
        else (lambda: passkit.aot_function(loss_of, pipeline="training-python")(params, x))
    packed = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        assert not isinstance(t, torch._subclasses.FakeTensor), "a hook ran on a traced fake tensor"
        packed.append(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = step()
    loss.backward()
    eager(x).square().mean().backward()
    assert packed  # the compiled step's saved tensors went through the user's hooks
    for ours, theirs in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)


@pytest.mark.slow
def test_compile_imports_inductors_compiler_up_front_only_for_a_pipeline_that_runs_it() -> None:
    # codegen.inductor's ``prepare``: a warm restart's first step must not pay Inductor's imports.
    import subprocess
    import sys

    script = ("import sys, torch, passkit; passkit.compile(torch.nn.Linear(2, 2), pipeline=sys.argv[1]); "
              "print('torch._inductor.compile_fx' in sys.modules)")
    found = {name: subprocess.run([sys.executable, "-c", script, name], capture_output=True, text=True,
                                  check=True).stdout.strip()
             for name in ("training", "training-python")}
    assert found == {"training": "True", "training-python": "False"}
