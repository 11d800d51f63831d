"""reinplace: functional ops become in-place where nothing else reads their input.

Measured, not assumed: one step runs under torch's profiler with ``profile_memory`` and the
bytes the ATen allocator hands out (and the peak of what is live) are summed from its events
(tests/allocations.py).
Results stay bitwise equal to the same pipeline without the step, and close to eager.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from allocations import allocations

import passkit


class TanhGeluMLP(torch.nn.Module):
    """GPT-2's MLP: its tanh GELU (transformers' ``NewGELUActivation``) is a chain of pointwise ops."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.fc, self.proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + self.proj(h)


def _pipeline(tmp_path: Path, base: str, *, after: str = "fx.dce") -> str:
    path = tmp_path / f"{base}-reinplace.toml"
    path.write_text(f'[pipeline]\nname = "r"\nextends = "{base}"\n\n[[steps]]\npass = "reinplace"\nafter = "{after}"\n')
    return str(path)


def _stats(compiled: Any) -> dict[str, Any]:
    return next(rec.stats for rep in compiled.passkit_reports for rec in rep.records if rec.pass_name == "reinplace")


def test_a_training_step_allocates_half_the_bytes_with_bitwise_equal_results(tmp_path) -> None:
    torch.manual_seed(0)
    model, x = TanhGeluMLP(), torch.randn(4, 32, 64)
    runs = {}
    for label, pipeline in (("functional", "training-python"), ("reinplaced", _pipeline(tmp_path, "training-python"))):
        twin = copy.deepcopy(model)
        compiled = passkit.aot_module(twin, pipeline=pipeline, cache="off")

        def step() -> torch.Tensor:
            twin.zero_grad(set_to_none=True)
            out = compiled(x)
            out.square().mean().backward()
            return out

        out = step()
        runs[label] = (out, [p.grad for p in twin.parameters()], allocations(step), compiled)
    (out_f, grads_f, (alloc_f, peak_f), _), (out_r, grads_r, (alloc_r, peak_r), compiled) = runs.values()
    assert torch.equal(out_r, out_f) and all(torch.equal(a, b) for a, b in zip(grads_r, grads_f))
    expected = model(x)
    expected.square().mean().backward()
    torch.testing.assert_close(out_r, expected)
    for p, g in zip(model.parameters(), grads_r):
        torch.testing.assert_close(g, p.grad)
    stats = _stats(compiled)
    assert stats["reinplaced"] >= 10  # the GELU chain in the forward and in the backward
    # Measured: 3,376,396 -> 1,770,800 bytes allocated (x0.52). The peak is where saved values
    # and the first gradients meet, which no reinplaced op touches: it stays the same.
    assert alloc_r < 0.6 * alloc_f, (alloc_r, alloc_f)
    assert peak_r <= peak_f, (peak_r, peak_f)


def test_an_inference_call_peaks_lower(tmp_path) -> None:
    torch.manual_seed(0)
    model, x = TanhGeluMLP(), torch.randn(4, 32, 64)
    figures, outs = [], []
    with torch.no_grad():
        expected = model(x)
        for pipeline in ("inference-python", _pipeline(tmp_path, "inference-python")):
            compiled = passkit.aot_module(copy.deepcopy(model), pipeline=pipeline, cache="off")
            outs.append(compiled(x))
            figures.append(allocations(lambda: compiled(x)))
    (alloc_f, peak_f), (alloc_r, peak_r) = figures
    assert torch.equal(outs[1], outs[0])
    torch.testing.assert_close(outs[1], expected)
    # Measured: peak 524,296 -> 393,224 bytes (x0.75), allocated 1,245,216 -> 426,028 (x0.34):
    # each op of the GELU chain writes into the tensor it read instead of a new one beside it.
    assert peak_r <= 0.8 * peak_f, (peak_r, peak_f)
    assert alloc_r < 0.5 * alloc_f, (alloc_r, alloc_f)


class _ReadsItsInputTwice(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x @ self.w)  # tanh's output is saved for the backward
        return (x * 2 + y).relu() * self.w.sum()


def test_inputs_parameters_and_saved_values_are_never_overwritten(tmp_path) -> None:
    torch.manual_seed(0)
    model, x = _ReadsItsInputTwice(), torch.randn(8, 16, requires_grad=True)
    twin = copy.deepcopy(model)
    compiled = passkit.aot_module(twin, pipeline=_pipeline(tmp_path, "training-python"), cache="off")
    x_before, w_before = x.detach().clone(), twin.w.detach().clone()
    out = compiled(x)
    assert torch.equal(x, x_before) and torch.equal(twin.w, w_before)
    # A second backward through the same saved values gives exactly twice the gradients.
    out.sum().backward(retain_graph=True)
    first = twin.w.grad.clone(), x.grad.clone()
    out.sum().backward()
    assert torch.equal(twin.w.grad, 2 * first[0]) and torch.equal(x.grad, 2 * first[1])
    x_eager = x.detach().requires_grad_()
    model(x_eager).sum().backward()
    torch.testing.assert_close(first[0], model.w.grad)
    torch.testing.assert_close(first[1], x_eager.grad)
    assert _stats(compiled)["reinplaced"] > 0


def test_random_draws_stay_functional_and_match_eager(make_program) -> None:
    from passkit.passes.reinplace import reinplace

    def dropout_then_scale(x):
        return torch.nn.functional.dropout(x * 3, 0.5, training=True) + 1

    x = torch.randn(64, 64)
    program = make_program(dropout_then_scale, x, passes=("functionalize", "decompose"))
    reinplace.run(program, reinplace.options_model())
    code = program.graphs["main"].code
    assert "aten.bernoulli.p(" in code and "bernoulli_" not in code, code  # the draw stays functional
    assert "aten.add_.Tensor(" in code, code  # while the ops around it are reinplaced
    torch.manual_seed(1)
    expected = dropout_then_scale(x)
    torch.manual_seed(1)
    (got,) = program.graphs["main"](x)
    assert torch.equal(got, expected)


def test_a_training_program_is_reinplaced_only_after_partitioning(tmp_path) -> None:
    model, x = TanhGeluMLP(16), torch.randn(2, 16)
    pipeline = _pipeline(tmp_path, "training-python", after="joint")
    compiled = passkit.aot_module(model, pipeline=pipeline, cache="off", repro_dir=str(tmp_path / "repro"))
    with pytest.raises(passkit.PassError) as caught:
        compiled(x)
    assert str(caught.value).split(" (after:")[0] == (
        f"{tmp_path}/training-python-reinplace.toml: steps[0] (reinplace) failed: PassError: reinplace: a training "
        "program is reinplaced after partitioning (found graph 'joint'); put the step after the partition step"
    )


def test_a_step_needing_functional_graphs_after_it_is_rejected_when_the_file_loads(tmp_path) -> None:
    path = tmp_path / "late_rewrite.toml"
    path.write_text(
        '[pipeline]\nname = "late"\nextends = "inference-python"\n\n'
        '[[steps]]\npass = "reinplace"\nbefore = "fx.cse"\n\n'
        '[[steps]]\npass = "rewrite"\npatterns = ["noops"]\nafter = "fx.dce"\n'
    )
    with pytest.raises(passkit.PipelineError) as caught:
        passkit.load_pipeline(str(path))
    assert str(caught.value) == (
        f"{path}: steps[1] (rewrite): requires fact 'functional', which the earlier step 'reinplace' invalidates"
    )


def test_symbolic_shapes_are_skipped_and_reported(tmp_path) -> None:
    torch.manual_seed(0)
    model, x = _ReadsItsInputTwice(), torch.randn(3, 16)
    pipeline = _pipeline(tmp_path, "training-python")
    backend = passkit.backend(pipeline=pipeline, cache="off", repro_dir=str(tmp_path / "repro"))
    compiled = torch.compile(copy.deepcopy(model), backend=backend, dynamic=True)
    start = len(passkit.reports())
    torch.testing.assert_close(compiled(x), model(x))
    (stats,) = [rec.stats for rep in passkit.reports()[start:] for rec in rep.records if rec.pass_name == "reinplace"]
    assert stats == {
        "reinplaced": 0, "scatters_removed": 0, "bytes_not_allocated": 0,
        "skipped": {"forward": "symbolic shapes", "backward": "symbolic shapes"},
    }


def test_an_input_at_another_storage_offset_stays_functional(make_program) -> None:
    from passkit.passes.reinplace import reinplace

    def rows_after_the_first(x):
        return (x * 2)[1:] + 1  # the slice starts one row into the product's storage

    x = torch.randn(6, 8)
    program = make_program(rows_after_the_first, x)
    reinplace.run(program, reinplace.options_model())
    code = program.graphs["main"].code
    assert "aten.mul.Tensor(" in code and "aten.add.Tensor(" in code and "add_" not in code, code
    assert torch.equal(program.graphs["main"](x)[0], rows_after_the_first(x))


def test_a_sum_with_an_input_first_writes_into_the_operand_that_dies(make_program) -> None:
    from passkit.passes.reinplace import reinplace

    def input_plus_product(x, w):
        return x + w * 2  # x is an input: only the product can take the sum

    x, w = torch.randn(4, 8), torch.randn(4, 8)
    program = make_program(input_plus_product, x, w)
    reinplace.run(program, reinplace.options_model())
    code = program.graphs["main"].code
    assert "torch.ops.aten.add_.Tensor(mul, arg0_1)" in code, code
    x_before = x.clone()
    assert torch.equal(program.graphs["main"](x, w)[0], input_plus_product(x, w))
    assert torch.equal(x, x_before)


class _RefuseOneReinplace:
    """A ``passkit_should_apply`` plugin: records what reinplace asks, refuses application ``refuse``."""

    def __init__(self, refuse: int | None = None) -> None:
        self.refuse, self.asked = refuse, []

    @passkit.hookimpl
    def passkit_should_apply(self, context: passkit.StepContext, application: passkit.Application) -> bool | None:
        if context.step.pass_name != "reinplace":
            return None
        self.asked.append(application)
        return False if application.index == self.refuse else None


def _gelu_chain(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0))))


def _reinplaced(make_program, tmp_path: Path, x: torch.Tensor):
    from passkit.core.plugins import get_plugin_manager
    from passkit.core.registry import get_registry
    from passkit.core.runner import run_pipeline

    program = make_program(_gelu_chain, x, passes=())
    pipeline = passkit.load_pipeline(_pipeline(tmp_path, "inference-python"))
    report = run_pipeline(pipeline, program, pm=get_plugin_manager(), registry=get_registry())
    nodes = {node.name: node for node in program.graphs["main"].graph.nodes}
    return program, next(r.stats for r in report.records if r.pass_name == "reinplace"), nodes


def test_each_conversion_is_asked_once_and_a_refused_one_stays_functional(make_program, register_passkit_plugin,
                                                                           tmp_path) -> None:
    from passkit import _torch

    x = torch.randn(8, 16)
    plugin = register_passkit_plugin(_RefuseOneReinplace())
    _, stats, _ = _reinplaced(make_program, tmp_path, x)
    asked = plugin.asked
    assert len(asked) == stats["reinplaced"] + stats["scatters_removed"] >= 4
    assert [a.index for a in asked] == list(range(1, len(asked) + 1))
    assert len({a.nodes for a in asked}) == len(asked) and all(len(a.nodes) == 1 for a in asked)  # once per node
    assert {(a.kind, a.graph) for a in asked} == {("reinplace", "main")}
    assert "aten.tanh.default -> aten.tanh_.default" in [a.name for a in asked]

    refused = asked[1]
    plugin.refuse, plugin.asked = 2, []
    program, stats, nodes = _reinplaced(make_program, tmp_path, x)
    assert plugin.asked == asked  # the same questions: each conversion once, in graph order
    assert stats["reinplaced"] == len(asked) - 1
    for application in asked:
        functional, inplace = application.name.split(" -> ")
        expected = functional if application is refused else inplace
        assert _torch.op_name(nodes[application.nodes[0]].target) == expected, application
    (got,) = program.graphs["main"](x)
    torch.testing.assert_close(got, _gelu_chain(x))


def test_bisect_names_a_bad_reinplace_application(register_passkit_plugin, tmp_path, monkeypatch) -> None:
    """A reinplace that computes one op wrongly (planted: its in-place op becomes a subtraction)
    is found among the good ones, down to its node."""
    import planted_bugs
    from passkit.debug.bisect_model import bisect_model
    from passkit.passes import reinplace as reinplace_module
    from passkit.core.plugins import get_plugin_manager
    from passkit.core.registry import get_registry

    monkeypatch.chdir(tmp_path)
    real_pass = reinplace_module._torch.reinplace_graph

    def with_a_bad_conversion(gm, sample):  # the tanh's residual add in chain's forward goes wrong
        real_pass(gm, sample)
        for node in gm.graph.nodes:
            if node.name == "add_1" and node.target is torch.ops.aten.add_.Tensor:
                node.target = torch.ops.aten.sub_.Tensor
        gm.recompile()

    monkeypatch.setattr(reinplace_module._torch, "reinplace_graph", with_a_bad_conversion)
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    fixed = Path(__file__).resolve().parents[1] / "debug" / "fixed_training.toml"
    path = tmp_path / "reinplaced.toml"
    path.write_text(f'[pipeline]\nname = "r"\nextends = "{fixed}"\n\n[[steps]]\npass = "reinplace"\nafter = "fx.dce"\n')
    pipeline = passkit.load_pipeline(str(path))
    results, _ = bisect_model(pipeline, "planted_bugs:chain", pm=get_plugin_manager(), registry=get_registry())
    (result,) = results
    assert pipeline.where(result.first_bad) == f"{path.name}: steps[0] (reinplace)"
    assert result.outcome.kind == "numerics"
    bad = result.pattern_application
    # The application names what the conversion makes, here the planted subtraction.
    assert (bad.kind, bad.graph, bad.nodes, bad.name) == ("reinplace", "forward", ("add_1",), "aten.add.Tensor -> aten.sub_.Tensor")
    assert 1 < bad.index < result.applications  # found among good ones on both sides
