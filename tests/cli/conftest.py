"""Fixtures for CLI tests: a registry of small test passes in place of the installed plugins."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.plugins import make_plugin_manager
from passkit.core.program import Program
from passkit.core.registry import Registry, build_registry


@graph_pass("t.functional", produces={"functional"})
def functional(program: Program) -> bool:
    """Pretend to functionalize."""
    return False


@graph_pass("t.fold", requires={"functional"})
def fold(program: Program, *, limit: int = 100, keep: list[str] = ["aten.gelu"]) -> bool:  # noqa: B006
    """Fold constant expressions.

    Longer explanation that listings leave out.
    """
    return False


@graph_pass("t.codegen", produces={"compiled"})
def codegen(program: Program) -> bool:
    """Pretend to compile."""
    return False


class CliTestPasses:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return [functional, fold, codegen]


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Registry:
    """The registry every command sees: the test passes only, from plugin 'clitest'."""
    pm = make_plugin_manager(load_entry_points=False, builtins=False)
    pm.register(CliTestPasses(), name="clitest")
    built = build_registry(pm)
    monkeypatch.setattr("passkit.core.registry.get_registry", lambda: built)
    return built


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in a temporary directory so messages show short relative file names."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PASSKIT_DEBUG", raising=False)
    return tmp_path


@pytest.fixture
def good_toml() -> str:
    """A valid three-step pipeline over the test passes, with ``verify = "facts"``."""
    return GOOD_TOML


GOOD_TOML = """\
[pipeline]
name = "good"
description = "functionalize, fold, compile"

[settings]
verify = "facts"

[[steps]]
pass = "t.functional"

[[steps]]
pass = "t.fold"
limit = 7

[[steps]]
pass = "t.codegen"
"""
