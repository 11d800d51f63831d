"""Every way in takes a pipeline written as a dict, with a notebook's ``Pass`` object in its
steps: ``compile``, ``backend``, ``aot_function``, ``aot_module``, ``inductor_options`` and
``load_pipeline``. Mistakes name the caller's line; a pass reading a value that cannot be
hashed compiles every time, and its report says why."""

from __future__ import annotations

import copy
import inspect
import os
from pathlib import Path

import pytest
import torch
from notebook_pass import fold_double_neg

import passkit
from passkit.cache.store import CACHE_ENV

HERE = Path(__file__).name


PIPELINE = {"pipeline": {"extends": "training-python"}, "steps": [{"pass": fold_double_neg, "after": "decompose"}]}


def double_neg(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (-(-(x @ w))).relu()


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (-(-self.linear(x))).relu()


def _rewrites(report) -> int:
    return next(record.stats["rewrites"] for record in report.records if record.id == "nb.fold_double_neg")


def _check_module(compiled, model: torch.nn.Module, eager: torch.nn.Module) -> None:
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    compiled(x).sum().backward()
    eager(x).sum().backward()
    for mine, theirs in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad)


@pytest.mark.parametrize("way", ["compile", "backend", "aot_module"])
def test_a_module_compiles_through_a_dict_pipeline(way: str) -> None:
    torch.manual_seed(0)
    model = Model()
    eager = copy.deepcopy(model)
    if way == "compile":
        compiled = passkit.compile(model, pipeline=PIPELINE)
        reports = compiled.passkit_reports
    elif way == "backend":
        backend = passkit.backend(PIPELINE)
        compiled, reports = torch.compile(model, backend=backend), backend.reports
    else:
        compiled = passkit.aot_module(model, pipeline=PIPELINE)
        reports = compiled.passkit_reports
    _check_module(compiled, model, eager)
    assert [_rewrites(report) for report in reports] == [1]


def test_a_function_compiles_through_a_dict_pipeline() -> None:
    compiled = passkit.aot_function(double_neg, pipeline=PIPELINE)
    x, w = torch.randn(3, 4), torch.randn(4, 2, requires_grad=True)
    torch.testing.assert_close(compiled(x, w), double_neg(x, w))
    report = compiled.passkit_reports[0]
    assert _rewrites(report) == 1 and report.pipeline == "test_dict_pipelines"
    assert not report.uncached


def test_a_dict_mounts_in_inductors_slots() -> None:
    options = passkit.inductor_options({"steps": [{"pass": fold_double_neg, "slot": "post_grad_pre"}]})
    assert list(options) == ["post_grad_custom_pre_pass"]


def test_a_mistake_names_the_line_that_handed_the_dict_over() -> None:
    with pytest.raises(passkit.PipelineError) as info:
        line = inspect.currentframe().f_lineno + 1
        passkit.compile(Model(), pipeline={**PIPELINE, "steps": [{"pass": fold_double_neg, "max_rewrites": "x"}]})
    assert str(info.value) == (
        f"{_shown()}:{line}: steps[0] (nb.fold_double_neg).max_rewrites: expected an integer, got a string (\"x\")")


def test_load_pipeline_explains_a_dict_with_its_line() -> None:
    line = inspect.currentframe().f_lineno + 1
    pipeline = passkit.load_pipeline(PIPELINE)
    text = str(pipeline.explain())
    assert f"pipeline test_dict_pipelines ({_shown()}:{line})" in text.splitlines()[0]
    assert any(row.split()[1:2] == ["nb.fold_double_neg"] and row.endswith(f"{_shown()}:{line}")
               for row in text.splitlines())


def _shown() -> str:
    """This file as messages show a path: relative to the working directory (a test's own temp
    folder, so never), else to the folder above its package, else absolute."""
    from passkit.pipeline.messages import display_path

    return display_path(Path(__file__))


WEIGHTS = torch.ones(2)


@passkit.graph_pass("nb.reads_a_tensor", requires={"functional"})
def reads_a_tensor(program: passkit.Program) -> bool:
    """Reads a tensor it cannot be keyed on."""
    return bool(WEIGHTS.sum() < 0)


def test_a_pass_reading_a_tensor_compiles_every_time_and_the_report_says_why() -> None:
    pipeline = {"pipeline": {"extends": "training-python"}, "steps": [{"pass": reads_a_tensor, "after": "functionalize"}]}
    line = inspect.currentframe().f_lineno + 1
    first = passkit.aot_function(double_neg, pipeline=pipeline)
    x, w = torch.randn(3, 4), torch.randn(4, 2, requires_grad=True)
    first(x, w)
    report = first.passkit_reports[0]
    why = f"{_shown()}:{line}: steps[0] (nb.reads_a_tensor): the global 'WEIGHTS' is a Tensor, which passkit cannot hash"
    assert report.uncached == why
    assert report.table().splitlines()[-1] == f"not cached: {why}"
    assert list(Path(os.environ[CACHE_ENV]).glob("*.entry")) == []
    second = passkit.aot_function(double_neg, pipeline=pipeline)
    second(x, w)
    assert second.passkit_reports[0].cache == ""  # compiled again, not loaded
