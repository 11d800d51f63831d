"""passkit's pytest plugin (passkit.testing), run the way a pass author runs it: in a pytest session.

Each test writes a test module for pass authors into a pytester directory and runs pytest on it
in-process; the fixtures come from the ``pytest11`` entry point, not from an import.
"""

from __future__ import annotations

import pytest
import torch

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module", autouse=True)
def torch_already_imported() -> None:
    """Import and exercise the tracing stack before any pytester run.

    pytester drops the modules an inner run imported when the test ends; torch re-imported in
    the same process crashes. Modules loaded here, before pytester's snapshot, stay.
    """
    from passkit.frontends.capture import program_from_function
    from passkit.verify.evaluate import Reference
    from passkit.core.registry import get_registry

    x = torch.ones(2, requires_grad=True)
    program = program_from_function(lambda x: (x * 2).sin(), [x])
    reference = Reference(program, [x])
    for name in ("functionalize", "joint", "fx.dce"):
        get_registry().get_pass(name).run(program)
    reference.compare(program)

PASSES = '''
import torch
import passkit
from passkit.testing import assert_pass_preserves_numerics

aten = torch.ops.aten


@passkit.graph_pass("t.double_to_add", requires={"functional"})
def double_to_add(program):
    """Rewrite x * 2 as x + x: same numbers."""
    changed = False
    for gm in program.graphs.values():
        for node in gm.graph.nodes:
            if node.target is aten.mul.Tensor and node.args[1] == 2:
                node.target, node.args = aten.add.Tensor, (node.args[0], node.args[0])
                changed = True
        gm.recompile()
    program.record_stat("rewrites", int(changed))
    return changed


@passkit.graph_pass("t.mul_to_add", requires={"functional"})
def mul_to_add(program):
    """Replace every mul by add: a broken pass."""
    for gm in program.graphs.values():
        for node in gm.graph.nodes:
            if node.target is aten.mul.Tensor:
                node.target = aten.add.Tensor
        gm.recompile()
    return True


@passkit.graph_pass("t.needs_joint", requires={"joint"})
def needs_joint(program):
    """Needs the joint graph."""
    return False
'''


def run_module(pytester: pytest.Pytester, body: str) -> pytest.HookRecorder:
    pytester.makepyfile(test_author=PASSES + body)
    return pytester.inline_run("-p", "no:cacheprovider", "-q")


def failure_messages(recorder: pytest.HookRecorder) -> list[str]:
    """What pytest prints for each failed test: the whole failure text, nothing truncated."""
    return [report.longreprtext for report in recorder.getfailures()]


def test_correct_pass_passes(pytester: pytest.Pytester) -> None:
    result = run_module(pytester, '''
def test_double(make_program):
    program = make_program(lambda x: (x * 2).sin(), torch.randn(5))
    assert assert_pass_preserves_numerics(double_to_add, program) is True
    assert program.stats == {"rewrites": 1}
    assert "aten.mul" not in program.graphs["main"].code


def test_training_program_with_gradients(make_program):
    x = torch.randn(3, requires_grad=True)
    program = make_program(lambda x: (x * 2).sin(), x, passes=("functionalize", "joint"))
    assert sorted(program.facts) == ["captured", "functional", "joint"]
    assert assert_pass_preserves_numerics(double_to_add, program) is True


def test_unchanged_graph_reports_false(make_program):
    program = make_program(lambda x: x.sin(), torch.randn(2))
    assert assert_pass_preserves_numerics(double_to_add, program) is False
''')
    result.assertoutcome(passed=3)


def test_pass_that_breaks_numerics_fails_with_the_difference(pytester: pytest.Pytester) -> None:
    result = run_module(pytester, '''
def test_broken(make_program):
    program = make_program(lambda x: x * 3, torch.ones(2))
    assert_pass_preserves_numerics(mul_to_add, program)
''')
    result.assertoutcome(failed=1)
    # ones * 3 = 3, ones + 3 = 4: the largest difference is 1, in the only output.
    assert failure_messages(result) == [
        "pass t.mul_to_add changed numerics: max |diff| 1 in output[0] of graph main (rtol 0.0001, atol 1e-05)"
    ]


def test_broken_gradient_is_caught_in_a_training_program(pytester: pytest.Pytester) -> None:
    result = run_module(pytester, '''
def test_broken_backward(make_program):
    # The joint graph's backward multiplies too; the forward (x + x) * 3 stays a mul.
    x = torch.ones(2, requires_grad=True)
    program = make_program(lambda x: (x + x) * 3, x, passes=("functionalize", "joint"))
    assert_pass_preserves_numerics(mul_to_add, program)
''')
    result.assertoutcome(failed=1)
    (message,) = failure_messages(result)
    assert message.startswith("pass t.mul_to_add changed numerics: max |diff| ")
    assert message.endswith(" of graph joint (rtol 0.0001, atol 1e-05)")


def test_pass_can_be_named_by_its_registered_name(pytester: pytest.Pytester) -> None:
    result = run_module(pytester, '''
def test_builtin_by_name(make_program):
    program = make_program(lambda x: x.sin() * x.sin(), torch.randn(3))
    assert program.graphs["main"].code.count("aten.sin") == 2
    assert assert_pass_preserves_numerics("fx.cse", program) is True
    assert program.graphs["main"].code.count("aten.sin") == 1
''')
    result.assertoutcome(passed=1)


def test_missing_fact_fails_before_running_the_pass(pytester: pytest.Pytester) -> None:
    result = run_module(pytester, '''
def test_needs_joint(make_program):
    program = make_program(lambda x: x.sin(), torch.randn(3))
    assert_pass_preserves_numerics(needs_joint, program)
''')
    result.assertoutcome(failed=1)
    assert failure_messages(result) == [
        "pass t.needs_joint requires fact 'joint', which the program "
        "lacks (facts: captured, functional); build it with make_program(..., passes=[...]) naming a pass that produces it"
    ]


def test_program_not_from_make_program_is_refused(pytester: pytest.Pytester) -> None:
    result = run_module(pytester, '''
import pytest
from passkit.frontends.capture import program_from_function


def test_bare_program():
    program = program_from_function(lambda x: x * 2, [torch.randn(2)])
    with pytest.raises(ValueError) as raised:
        assert_pass_preserves_numerics(double_to_add, program)
    assert str(raised.value) == "build the program with the make_program fixture, which keeps its inputs"
''')
    result.assertoutcome(passed=1)


def test_plugin_manager_fixture_is_fresh_and_accepts_a_plugin(pytester: pytest.Pytester) -> None:
    result = run_module(pytester, '''
from passkit.core.plugins import get_plugin_manager
from passkit.core.registry import build_registry


class Author:
    @passkit.hookimpl
    def passkit_register_passes(self):
        return [double_to_add]


def test_register(passkit_plugin_manager):
    assert passkit_plugin_manager is not get_plugin_manager()
    passkit_plugin_manager.register(Author(), name="author")
    registry = build_registry(passkit_plugin_manager)
    assert registry.passes["t.double_to_add"].plugin == "author"
    assert "fx.dce" in registry.passes
    assert "t.double_to_add" not in build_registry(get_plugin_manager()).passes
''')
    result.assertoutcome(passed=1)
