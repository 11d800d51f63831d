"""A ``--model`` factory is the user's code: when it (or its module, as it is imported) raises,
``passkit run`` and ``passkit bisect`` exit 2 (bad input) with one line naming the factory and
its error, never 5 ("internal error in passkit or a plugin")."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from passkit.cli import main

MODELS = textwrap.dedent(
    '''
    def raises():
        raise ValueError("no checkpoint at /models/acme.pt")

    def raises_bare():
        raise KeyError
    '''
)


@pytest.fixture
def models(request: pytest.FixtureRequest) -> str:
    name = f"factory_models_{request.node.name.split('[')[0][-20:]}"  # a fresh module per test
    Path(f"{name}.py").write_text(MODELS)
    Path(f"{name}_broken.py").write_text("import torch\n1 / 0\n")
    return name


@pytest.mark.parametrize("command", ["run", "bisect"])
def test_a_factory_that_raises_is_bad_input_naming_the_factory(models: str, command: str) -> None:
    result = CliRunner().invoke(main, [command, "training-python", "--model", f"{models}:raises"])
    assert (result.exit_code, result.stderr) == (2, (
        f"--model {models}:raises: the factory raised ValueError: no checkpoint at /models/acme.pt\n"))
    result = CliRunner().invoke(main, [command, "training-python", "--model", f"{models}:raises_bare"])
    assert (result.exit_code, result.stderr) == (2, f"--model {models}:raises_bare: the factory raised KeyError\n")


@pytest.mark.parametrize("command", ["run", "bisect"])
def test_a_model_module_that_raises_as_it_is_imported_is_bad_input(models: str, command: str) -> None:
    result = CliRunner().invoke(main, [command, "training-python", "--model", f"{models}_broken:tiny"])
    assert (result.exit_code, result.stderr) == (2, (
        f"--model {models}_broken:tiny: importing '{models}_broken' raised ZeroDivisionError: division by zero\n"))


def test_a_bad_model_error_stands_alone_with_no_table_header_above_it(models: str) -> None:
    # The header ("passkit run: compiling ... (8 steps) ...") waits until the model is built.
    result = CliRunner().invoke(main, ["run", "training-python", "--model", "no_such_models:tiny"])
    assert (result.exit_code, result.stderr) == (2, (
        "--model no_such_models:tiny: cannot import 'no_such_models': No module named 'no_such_models'\n"))
