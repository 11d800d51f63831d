"""Partitioners report what they save; codegen compiles the backward before any backward call."""

from __future__ import annotations

import torch

import passkit
from passkit.frontends.capture import program_from_function
from passkit.passes.codegen_python import codegen_python
from passkit.passes.functionalize import functionalize
from passkit.passes.joint import joint
from passkit.passes.partition import default_partition, torch_min_cut


def _split(partition, fn, *inputs):
    program = program_from_function(fn, list(inputs))
    for pass_ in (functionalize, joint, partition):
        program.stats.clear()  # as the runner does before each step
        pass_(program)
    return program


def test_default_partition_saves_what_the_backward_reads() -> None:
    program = _split(default_partition, lambda x: x.sin().cos(), torch.randn(4, requires_grad=True))
    saved = [d for d in program.io("backward").inputs if d.kind == "saved"]
    assert len(saved) == 2  # x for cos' and sin's backward, and sin(x)
    assert program.stats == {"saved": 2, "saved_bytes": 32, "activation_bytes": 16}
    assert set(program.graphs) == {"forward", "backward"}


def test_torch_min_cut_recomputes_cheap_ops() -> None:
    program = _split(torch_min_cut, lambda x: x.sin().cos(), torch.randn(4, requires_grad=True))
    assert program.stats == {"saved": 1, "saved_bytes": 16, "activation_bytes": 0}


def test_the_backward_is_compiled_at_compile_time() -> None:
    program = _split(default_partition, lambda x: x.exp(), torch.randn(3, requires_grad=True))
    codegen_python(program)
    assert set(program.compiled) == {"forward", "backward"}


def test_report_rows_show_saved_tensors() -> None:
    compiled = passkit.aot_function(lambda x: x.sin().cos(), pipeline="training-python")
    compiled(torch.randn(4, requires_grad=True)).sum().backward()
    (report,) = compiled.passkit_reports
    row = next(r for r in report.records if r.id == "partition.default")
    assert row.stats["saved"] >= 1 and row.stats["saved_bytes"] > 0
    assert "saved=" in report.table()


def test_min_cut_memory_budget_is_validated_and_applied(tmp_path) -> None:
    import pytest

    bad = tmp_path / "bad.toml"
    bad.write_text('[pipeline]\nname = "b"\nextends = "training"\n\n[override."partition.default"]\nenabled = false\n\n'
                   '[[steps]]\npass = "partition.torch_min_cut"\nafter = "partition.default"\nmemory_budget = 1.5\n')
    with pytest.raises(passkit.PipelineError) as info:
        passkit.load_pipeline(str(bad))
    assert str(info.value) == f"{bad}: steps[0] (partition.torch_min_cut).memory_budget: must be between 0 and 1"

    def fn(x, w1, w2):
        return ((x @ w1).relu().sin() @ w2).cos().sum()

    saved = {}
    for budget in (1.0, 0.0):
        program = program_from_function(fn, [torch.randn(8, 16), torch.randn(16, 32, requires_grad=True), torch.randn(32, 4, requires_grad=True)])
        for pass_ in (functionalize, joint):
            pass_(program)
        program.stats.clear()
        torch_min_cut(program, memory_budget=budget)
        saved[budget] = program.stats["activation_bytes"]
    assert saved[0.0] == 0 < saved[1.0]


def test_fast_calls_run_the_same_kernels_and_leave_the_graphs_alone() -> None:
    from passkit.examples.transformer import small_stack

    model, (x,) = small_stack()
    compiled = passkit.compile(model, pipeline="training-python")
    compiled(x).sum().backward()
    (program,) = compiled.passkit_backend.programs
    forward = program.graphs["forward"]
    assert "torch.ops.aten.view.default" in forward.code  # the IR keeps ATen ops
    values = [torch.randn(n.meta["val"].shape) for n in forward.graph.nodes if n.op == "placeholder"]
    fast = program.compiled["forward"](*values)
    codegen_python(program, fast_calls=False)
    plain = program.compiled["forward"](*values)
    assert len(fast) == len(plain)
    for a, b in zip(fast, plain):
        assert torch.equal(a, b)


def test_node_metadata_survives_the_training_pipeline() -> None:
    torch._dynamo.reset()

    def fn(x):
        return x.sin() * 2

    compiled = passkit.compile(fn, pipeline="training-python")
    compiled(torch.randn(3, requires_grad=True)).sum().backward()
    (program,) = compiled.passkit_backend.programs
    sin = next(n for n in program.graphs["forward"].graph.nodes if n.target is torch.ops.aten.sin.default)
    assert "return x.sin() * 2" in sin.meta["stack_trace"]
    assert sin.meta["val"].shape == (3,)
