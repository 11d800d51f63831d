"""The verify instrument re-checks facts (and numerics) after each step."""

from __future__ import annotations

import pytest

from passkit.errors import VerificationError


def test_a_step_that_claims_functional_but_leaves_a_mutation_is_caught(kit, program_factory) -> None:
    pipeline = kit.pipeline("test.noop", "test.fake_functional", verify="facts")
    with pytest.raises(VerificationError) as caught:
        kit.run(pipeline, program_factory(mutating=True))
    assert str(caught.value) == (
        "t.toml: steps[1] (test.fake_functional) broke fact 'functional': "
        "mutating ops remain: main:add__tensor (aten.add_.Tensor)"
    )


def test_a_later_step_that_breaks_an_established_fact_is_named(kit, program_factory) -> None:
    program = program_factory()
    program.facts.add("functional")
    with pytest.raises(VerificationError) as caught:
        kit.run(kit.pipeline("test.noop", "test.add_dead", "test.mutate", verify="facts"), program)
    assert str(caught.value) == (
        "t.toml: steps[2] (test.mutate) broke fact 'functional': mutating ops remain: main:add_tensor (aten.add_.Tensor)"
    )


def test_verify_off_lets_a_broken_fact_through(kit, program_factory) -> None:
    program = program_factory(mutating=True)
    kit.run(kit.pipeline("test.fake_functional"), program)
    assert "functional" in program.facts


def test_dumps_of_the_offending_step_exist_before_verification_fails(kit, program_factory, tmp_path) -> None:
    pipeline = kit.pipeline("test.fake_functional", verify="facts", dump="all", dump_dir=str(tmp_path))
    with pytest.raises(VerificationError):
        kit.run(pipeline, program_factory(mutating=True))
    assert sorted(p.name for p in (tmp_path / "graph-1").iterdir()) == ["00-captured-main.py", "01-test.fake_functional-main.py"]


class Reference:
    def __init__(self, answers: list[str | None]) -> None:
        self.answers = answers
        self.calls = 0
        self.tolerances: list[tuple[float, float]] = []

    def compare(self, program, tolerance: tuple[float, float]) -> str | None:
        self.calls += 1
        self.tolerances.append(tuple(tolerance))
        return self.answers.pop(0)


def test_numerics_names_the_step_whose_results_deviate(kit, program_factory) -> None:
    reference = Reference([None, "max |diff| 3.1e-02 in user[0] of graph main"])
    pipeline = kit.pipeline("test.noop", "test.add_dead", verify="numerics")
    with pytest.raises(VerificationError) as caught:
        kit.run(pipeline, program_factory(), reference=reference)
    assert str(caught.value) == (
        "t.toml: steps[1] (test.add_dead) changed numerics: max |diff| 3.1e-02 in user[0] of graph main"
    )


def test_numerics_compare_runs_after_each_step_and_only_with_numerics(kit, program_factory) -> None:
    reference = Reference([None, None])
    kit.run(kit.pipeline("test.noop", "test.noop", verify="numerics"), program_factory(), reference=reference)
    assert reference.calls == 2
    kit.run(kit.pipeline("test.noop", "test.noop", verify="facts"), program_factory(), reference=reference)
    assert reference.calls == 2


def test_numerics_verification_leaves_the_callers_random_state_alone() -> None:
    import torch

    import passkit

    x = torch.ones(4, requires_grad=True)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    compiled = passkit.aot_function(lambda x: x.sin() * 2, pipeline="training-python", verify="numerics")
    compiled(x).sum().backward()
    assert torch.equal(torch.rand(3), expected_next)


def test_numerics_uses_the_settings_tolerance_loosened_by_passes_that_ran(kit, program_factory) -> None:
    reference = Reference([None, None])
    pipeline = kit.pipeline("test.noop", "test.approximate", verify="numerics", rtol=1e-3, atol=1e-7)
    kit.run(pipeline, program_factory(), reference=reference)
    # Step 1 ran only test.noop; step 2 adds test.approximate's declared (1e-2, 1e-6).
    assert reference.tolerances == [(1e-3, 1e-7), (1e-2, 1e-6)]
