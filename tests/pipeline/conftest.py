"""Fixtures for the pipeline-file tests: a registry of small test passes with the same names and
contracts as the built-ins, and a helper that writes pipeline files into a working directory."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Callable

import pydantic
import pytest

from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.plugins import make_plugin_manager
from passkit.core.registry import Registry, build_registry


def _noop(program) -> bool:
    return False


class _DecomposeOptions(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    tables: list[str] = ["core_aten"]
    keep: list[str] = []
    extra: list[str] = []


class _MinCutOptions(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    memory_budget: float = 1.0

    @pydantic.field_validator("memory_budget")
    @classmethod
    def _between_0_and_1(cls, value: float) -> float:
        if not 0 <= value <= 1:
            raise ValueError("must be between 0 and 1")
        return value


TEST_PASSES = [
    graph_pass("functionalize", produces={"functional"})(_noop),
    graph_pass("decompose", requires={"functional"}, produces={"decomposed"}, options=_DecomposeOptions)(_noop),
    graph_pass("joint", requires={"functional"}, produces={"joint"}, training_only=True)(_noop),
    graph_pass(
        "partition.default", requires={"joint"}, produces={"partitioned"}, invalidates={"joint"}, training_only=True
    )(_noop),
    graph_pass(
        "partition.torch_min_cut",
        requires={"joint"},
        produces={"partitioned"},
        invalidates={"joint"},
        training_only=True,
        options=_MinCutOptions,
    )(_noop),
    graph_pass("fx.dce")(_noop),
    graph_pass("fx.cse")(_noop),
    graph_pass("codegen.python", produces={"compiled"})(_noop),
    graph_pass("acme.after_partition", requires={"partitioned"})(_noop),
]


class FakeBuiltins:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return list(TEST_PASSES)


@pytest.fixture
def registry() -> Registry:
    pm = make_plugin_manager(builtins=False, load_entry_points=False)
    pm.register_plugin(FakeBuiltins(), "fake_builtins", distribution=("passkit", "0.1.0"))
    return build_registry(pm)


@pytest.fixture
def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str], Path]:
    """Write a pipeline file into the (temporary) working directory; returns its relative path."""
    monkeypatch.chdir(tmp_path)

    def write_file(name: str, text: str) -> Path:
        path = Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    return write_file


TRAINING = """
[pipeline]
name = "train"
description = "test training pipeline"

[[steps]]
pass = "functionalize"

[[steps]]
pass = "decompose"

[[steps]]
pass = "joint"

[[steps]]
pass = "partition.default"

[[steps]]
pass = "fx.dce"

[[steps]]
pass = "codegen.python"
"""


@pytest.fixture
def base(write: Callable[[str, str], Path]) -> Path:
    """``base.toml``: a valid training pipeline of the test passes."""
    return write("base.toml", TRAINING)
