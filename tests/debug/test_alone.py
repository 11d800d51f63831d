"""One pass alone: the smallest pipeline made from a base that loads with the pass in it."""

from __future__ import annotations

import pytest

import passkit
from passkit.core.registry import get_registry
from passkit.debug.alone import pipeline_alone
from passkit.errors import PipelineError


@pytest.mark.parametrize(("base", "pass_id", "steps"), [
    # in the base: its own step, and what a training program needs around it
    ("training-python", "fx.cse", ["functionalize", "joint", "partition.default", "fx.cse", "codegen.python"]),
    ("training-python", "attention", ["functionalize", "attention", "joint", "partition.default", "codegen.python"]),
    # not in the base: after the facts it requires; one that takes a fact away, before the code generator
    ("training-python", "partition.min_cut", ["functionalize", "joint", "partition.min_cut", "codegen.python"]),
    ("training-python", "reinplace", ["functionalize", "joint", "partition.default", "reinplace", "codegen.python"]),
    # a code generator takes the code generator's place
    ("training-python", "codegen.inductor", ["functionalize", "joint", "partition.default", "codegen.inductor"]),
    ("inference-python", "fx.dce", ["fx.dce", "codegen.python"]),
])
def test_the_pass_keeps_only_the_steps_loading_and_training_need(base: str, pass_id: str, steps: list[str]) -> None:
    alone = pipeline_alone(passkit.load_pipeline(base), pass_id, get_registry())
    assert [s.id for s in alone.steps] == steps
    assert [s.position for s in alone.steps] == list(range(len(steps)))
    assert alone.where(alone.steps[0]) == f"{base}-{pass_id}-alone: steps[0] ({steps[0]})"


def test_a_pass_no_pipeline_can_hold_is_one_line() -> None:
    with pytest.raises(PipelineError, match=r"^passkit/pipelines/inference-python.toml: no pipeline made from its steps loads with pass 'codegen.triton'$"):
        pipeline_alone(passkit.load_pipeline("inference-python"), "codegen.triton", get_registry())
