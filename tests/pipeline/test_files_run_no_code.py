"""No pipeline file can make passkit import or run code: no key of a file names a module to
import. Only installed plugins run, and modules named on the command line (``--model``,
``--plugin``). Every key a file may hold, of the settings and of every registered pass's
options, is given the name of an importable module (bare, ``mod:function`` and
``mod.function``), and loading, validating, explaining and running those files never imports it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import tomli_w
import torch
from click.testing import CliRunner

import passkit
from passkit.cli import main
from passkit.core.registry import get_registry
from passkit.errors import PasskitError

MODULE = "passkit_planted_import"
# Importing it, or calling its function, leaves a file beside it.
SOURCE = '''import pathlib
pathlib.Path(__file__).with_suffix(".imported").touch()
def boom(*args, **kwargs):
    pathlib.Path(__file__).with_suffix(".called").touch()
    return {}
'''
NAMES = [MODULE, f"{MODULE}:boom", f"{MODULE}.boom"]


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # Importable from everywhere passkit could look: sys.path and the working directory.
    for folder in (tmp_path, Path.cwd()):
        (folder / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    yield tmp_path
    assert MODULE not in sys.modules
    for folder in (tmp_path, Path.cwd()):
        assert not (folder / f"{MODULE}.imported").exists() and not (folder / f"{MODULE}.called").exists()


def _values(name: str) -> list[Any]:
    return [name, [name], {name: {name: name}}]


def _documents() -> Iterator[dict[str, Any]]:
    """One file per key and value: each names the planted module where a string can go."""
    registry = get_registry()
    base = {"pipeline": {"name": "planted", "extends": "training-python"}}
    for name in NAMES:
        yield {"pipeline": {"name": name, "extends": name}}
        yield {**base, "steps": [{"pass": name, "after": "functionalize"}]}
        yield {**base, "disable": [name]}
        for key in registry.settings_model.model_fields:
            for value in _values(name):
                yield {**base, "settings": {key: value}}
        for pass_name, entry in registry.passes.items():
            for option in entry.pass_.options_model.model_fields:
                for value in _values(name):
                    yield {**base, "steps": [{"pass": pass_name, "id": f"planted.{pass_name}", "after": "functionalize",
                                              option: value}]}
                    yield {**base, "override": {pass_name: {option: value}}}


def test_no_key_of_a_pipeline_file_imports_or_runs_the_module_it_names(planted: Path) -> None:
    loaded = refused = 0
    for n, document in enumerate(_documents()):
        path = planted / f"file{n}.toml"
        path.write_text(tomli_w.dumps(document))
        try:
            passkit.load_pipeline(str(path)).explain()
            loaded += 1
        except PasskitError:
            refused += 1
    assert loaded > 0 and refused > 0  # strings are taken where a key holds free text, and refused elsewhere


def test_validate_explain_and_a_run_with_every_free_text_setting_naming_the_module(planted: Path) -> None:
    settings = {"dump": "all", "dump_dir": f"{MODULE}:boom", "report": f"{MODULE}.boom", "repro_dir": MODULE}
    path = planted / "named.toml"
    path.write_text(tomli_w.dumps({"pipeline": {"name": MODULE, "extends": "training-python",
                                                "description": f"{MODULE}:boom"}, "settings": settings}))
    runner = CliRunner()
    for command in (["validate", str(path)], ["explain", str(path)]):
        result = runner.invoke(main, command)
        assert result.exit_code == 0, result.output
    compiled = passkit.aot_function(lambda x: x.sin() * 2, pipeline=str(path))
    x = torch.randn(4, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, x.detach().cos() * 2)


def test_no_setting_or_option_is_a_type_that_imports() -> None:
    registry = get_registry()
    models = [registry.settings_model, *(entry.pass_.options_model for entry in registry.passes.values())]
    for model in models:
        for key, field in model.model_fields.items():
            annotation = str(field.annotation)
            assert "ImportString" not in annotation and "Callable" not in annotation and "type[" not in annotation, (
                f"{model.__name__}.{key}: {annotation}")
