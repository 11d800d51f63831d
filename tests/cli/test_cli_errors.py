"""Every failure prints one line on stderr, without a traceback, and exits with its documented code:
1 a step changed numerics, 2 bad input, 4 a step raised or broke a fact."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from passkit.cli import main
from passkit.errors import PassError, PipelineError, VerificationError


def _failing_check(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    def run_check(*args, **kwargs):
        raise error

    module = types.ModuleType("passkit.frontends.check")
    module.run_check = run_check
    monkeypatch.setitem(sys.modules, "passkit.frontends.check", module)


PASS_ERROR = "good.toml: steps[3] (fx.dce) failed: ValueError: bad node (after: functionalize, decompose, joint)"


NUMERICS_ERROR = "good.toml: steps[2] (t.fold) changed numerics: max |diff| 0.5 in output[0] of graph main"
FACT_ERROR = "good.toml: steps[2] (t.fold) broke fact 'functional': aten.add_.Tensor remains in graph main"
BAD_INPUT = "good.toml: steps[1] (t.fold).limit: Input should be a valid integer"


@pytest.mark.parametrize(
    ("error", "code"),
    [(PipelineError(BAD_INPUT), 2), (PassError(PASS_ERROR), 4), (VerificationError(NUMERICS_ERROR), 1), (VerificationError(FACT_ERROR), 4)],
    ids=["bad-input", "step-raised", "numerics", "broken-fact"],
)
def test_a_passkit_error_is_one_line_with_its_exit_code(cli, monkeypatch, error, code) -> None:
    monkeypatch.delenv("PASSKIT_DEBUG", raising=False)
    _failing_check(monkeypatch, error)
    result = cli.invoke(main, ["run", "good.toml"])
    assert (result.exit_code, result.stdout, result.stderr) == (code, "", str(error) + "\n")
    assert "Traceback" not in result.output


def test_an_unexpected_error_is_one_line_with_the_debug_hint_and_exit_5(cli, monkeypatch) -> None:
    monkeypatch.delenv("PASSKIT_DEBUG", raising=False)
    _failing_check(monkeypatch, RuntimeError("tensor exploded\nsecond line"))
    result = cli.invoke(main, ["run", "good.toml"])
    assert result.exit_code == 5  # not 2: nothing the user gave is wrong
    assert result.stderr == (
        "passkit: internal error in passkit or a plugin: RuntimeError: tensor exploded "
        "(run with PASSKIT_DEBUG=1 for the traceback and report it)\n"
    )


@pytest.mark.parametrize("error", [PassError(PASS_ERROR), RuntimeError("tensor exploded")])
def test_passkit_debug_reraises_for_the_traceback(cli, monkeypatch, error) -> None:
    monkeypatch.setenv("PASSKIT_DEBUG", "1")
    _failing_check(monkeypatch, error)
    result = cli.invoke(main, ["run", "good.toml"])
    assert result.exception is error
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run"], "passkit run: Missing argument 'FILE' (see 'passkit run --help')"),
        (["run", "x.toml", "--bogus"], "passkit run: No such option '--bogus' (see 'passkit run --help')"),
        (["frobnicate"], "passkit: No such command 'frobnicate' (see 'passkit --help')"),
        (["validate"], "passkit validate: Missing argument 'FILES...' (see 'passkit validate --help')"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(cli, args, message) -> None:
    result = cli.invoke(main, args)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", message + "\n")


def test_no_arguments_shows_help(cli) -> None:
    result = cli.invoke(main, [])
    assert result.exit_code == 0
    assert result.stdout.startswith("Usage: passkit [OPTIONS] COMMAND [ARGS]...")
    for command in ("explain", "passes", "pipelines", "run", "validate"):
        assert f"\n  {command} " in result.stdout


@pytest.mark.slow
def test_python_dash_m_passkit_prints_one_line_errors(tmp_path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "passkit", "validate", "missing.toml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={key: value for key, value in os.environ.items() if key != "PASSKIT_DEBUG"},
    )
    assert completed.returncode == 2
    assert completed.stdout == ""
    assert completed.stderr.splitlines()[-1] == "passkit: pipeline file not found: missing.toml"
    assert "Traceback" not in completed.stderr


def test_validate_refuses_an_unknown_decomposition_table(cli, tmp_path) -> None:
    path = tmp_path / "tables.toml"
    path.write_text('[pipeline]\nextends = "training-python"\n\n[override.decompose]\ntables = ["no_such_table"]\n')
    result = cli.invoke(main, ["validate", str(path)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"{path}: override.decompose.tables: unknown decomposition table 'no_such_table' (known: core_aten, full, inductor)"
    )
