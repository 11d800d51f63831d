"""Passes and hooks that fail: raise, return the wrong type, or change the program and then raise.

With ``on_error = "raise"`` the error names the step (file, index, id) and what ran before it.
With ``on_error = "eager"`` the user's program still computes eager's results, the fallback is
reported in ``passkit_fallbacks``, and the one warning points at the user's own line.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import passkit
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.program import Program

aten = torch.ops.aten


@graph_pass("test.fault.raise")
def raises(program: Program) -> bool:
    """Fail at once."""
    raise RuntimeError("boom")


@graph_pass("test.fault.wrong_type")
def wrong_type(program: Program) -> Any:
    """Return a tensor where a bool is expected."""
    return torch.ones(3)


@graph_pass("test.fault.mutate_then_raise")
def mutate_then_raise(program: Program) -> bool:
    """Rewrite every mm into an add, then fail half-way."""
    for gm in program.graphs.values():
        for node in gm.graph.nodes:
            if node.target is aten.mul.Tensor:
                node.target = aten.add.Tensor
        gm.recompile()
    raise ValueError("half-way")


class FaultyPasses:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return [raises, wrong_type, mutate_then_raise]


class RaisingWrapper:
    """A step wrapper (like a timing or dump plugin) that fails around one step."""

    @hookimpl(wrapper=True)
    def passkit_run_step(self, context):
        result = yield
        if context.step.id == "fx.cse":
            raise OSError("disk full")
        return result


@pytest.fixture
def faulty(register_passkit_plugin, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # failing steps write their reproducer under the working directory
    register_passkit_plugin(FaultyPasses(), name="test-faulty-passes")


def _pipeline(tmp_path: Path, pass_name: str, on_error: str) -> str:
    path = tmp_path / "faulty.toml"
    path.write_text(
        f'[pipeline]\nextends = "training-python"\n[settings]\non_error = "{on_error}"\n'
        f'[[steps]]\npass = "{pass_name}"\nafter = "joint"\n'
    )
    return str(path)


def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sin().sum(-1)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)


EXPECTED = {
    "test.fault.raise": "failed: RuntimeError: boom",
    "test.fault.wrong_type": "failed: RuntimeError: Boolean value of Tensor with more than one value is ambiguous",
    # The runner names the node the pass was at when it failed.
    "test.fault.mutate_then_raise": "failed at node output (output): ValueError: half-way",
}


@pytest.mark.parametrize("pass_name", sorted(EXPECTED))
def test_on_error_raise_names_the_failing_step(tmp_path, faulty, pass_name) -> None:
    pipeline = _pipeline(tmp_path, pass_name, "raise")
    compiled = passkit.aot_function(fn, pipeline=pipeline)
    with pytest.raises(passkit.PassError) as caught:
        compiled(*_inputs())
    assert str(caught.value) == (
        f"faulty.toml: steps[0] ({pass_name}) {EXPECTED[pass_name]} (after: functionalize, decompose, attention, joint) "
        f"(reproducer: passkit-repro/05-{pass_name})"
    )


@pytest.mark.parametrize("pass_name", sorted(EXPECTED))
def test_on_error_eager_gives_eager_results_and_reports_the_fallback(tmp_path, faulty, pass_name) -> None:
    pipeline = _pipeline(tmp_path, pass_name, "eager")
    compiled = passkit.aot_function(fn, pipeline=pipeline)
    x, w = _inputs()
    ex, ew = (t.detach().clone().requires_grad_() for t in (x, w))
    with pytest.warns(RuntimeWarning, match="passkit: compiling failed, running eagerly: "):
        out = compiled(x, w)
    out.sum().backward()
    expected = fn(ex, ew)
    expected.sum().backward()
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    torch.testing.assert_close((x.grad, w.grad), (ex.grad, ew.grad), rtol=0, atol=0)
    assert compiled.passkit_fallbacks == [
        f"faulty.toml: steps[0] ({pass_name}) {EXPECTED[pass_name]} (after: functionalize, decompose, attention, joint) "
        f"(reproducer: passkit-repro/05-{pass_name})"
    ]


def test_a_step_wrapper_that_raises_names_the_step(tmp_path, register_passkit_plugin, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    register_passkit_plugin(RaisingWrapper(), name="test-raising-wrapper")
    compiled = passkit.aot_function(fn, pipeline="training-python")
    with pytest.raises(passkit.PassError) as caught:
        compiled(*_inputs())
    message = str(caught.value)
    assert message.endswith(
        ": steps[6] (fx.cse) failed: OSError: disk full (after: functionalize, decompose, attention, joint, "
        "collectives.reshard, partition.default)"
    )
    assert message.split(":")[0].endswith("training-python.toml")


def test_the_fallback_warning_points_at_the_users_call_through_dynamo(tmp_path, faulty) -> None:
    pipeline = _pipeline(tmp_path, "test.fault.mutate_then_raise", "eager")
    model = torch.nn.Linear(3, 2)
    compiled = passkit.compile(model, pipeline=pipeline)
    x = torch.randn(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x)  # the line the warning must name
    line = test_the_fallback_warning_points_at_the_users_call_through_dynamo.__code__.co_firstlineno + 7
    fallback = [w for w in caught if "passkit: compiling failed" in str(w.message)]
    assert [(Path(w.filename).name, w.lineno) for w in fallback] == [(Path(__file__).name, line)]
    torch.testing.assert_close(out, model(x))
    assert compiled.passkit_fallbacks == [
        "faulty.toml: steps[0] (test.fault.mutate_then_raise) failed at node output (output): ValueError: half-way "
        "(after: functionalize, decompose, attention, joint) (reproducer: passkit-repro/05-test.fault.mutate_then_raise)"
    ]


def test_a_failing_step_on_dynamic_shapes_reports_its_own_error_not_a_guard_violation(tmp_path, faulty) -> None:
    """The reproducer cannot hold symbolic sizes; saying so must not guard the user's dynamic
    batch to this call's size (Dynamo then failed with a constraint violation and hid the error)."""
    compiled = torch.compile(fn, backend="passkit", options={"pipeline": _pipeline(tmp_path, "test.fault.raise", "raise")})
    x, w = _inputs()
    torch._dynamo.mark_dynamic(x, 0)
    with pytest.raises(passkit.PassError) as caught:
        compiled(x, w)
    assert str(caught.value) == (
        "faulty.toml: steps[0] (test.fault.raise) failed: RuntimeError: boom (after: functionalize, decompose, attention, joint) "
        "(reproducer: not written: Unportable: a tensor has symbolic sizes)"
    )
