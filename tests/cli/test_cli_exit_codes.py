"""``passkit run`` for real, with no fake ``check``: each documented exit code, from a pipeline file
that earns it (README's table: 0 ok, 1 results differ, 2 bad input, 3 fell back to eager, 4 a
step failed)."""

from __future__ import annotations

from pathlib import Path

import pytest

import planted_bugs
from passkit.cli import main

pytestmark = pytest.mark.slow

FIXED_TRAINING = str(Path(__file__).resolve().parents[1] / "debug" / "fixed_training.toml")


def _pipeline(folder: Path, step: str, *, settings: str = "", options: str = "") -> str:
    """``planted.toml``: the debugging tests' fixed pipeline with ``step`` after ``joint``."""
    (folder / "planted.toml").write_text(
        f'[pipeline]\nname = "planted"\nextends = "{FIXED_TRAINING}"\n\n[settings]\n{settings}\n'
        f'[[steps]]\npass = "{step}"\nafter = "joint"\n{options}'
    )
    return "planted.toml"


@pytest.fixture
def planted(register_passkit_plugin, workdir: Path) -> Path:
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    return workdir


def _run(cli, file: str):  # noqa: ANN001, ANN202
    return cli.invoke(main, ["run", file, "--model", "planted_bugs:tiny"])


def test_exit_0_when_the_results_match_eager(cli, planted) -> None:
    result = _run(cli, FIXED_TRAINING)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1].startswith("ok: ")


def test_exit_1_when_the_final_comparison_differs(cli, planted) -> None:
    result = _run(cli, _pipeline(planted, "planted.scale_add"))
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[-1].startswith("MISMATCH: planted.toml on planted_bugs:tiny (training) vs eager: ")


def test_exit_1_when_verify_numerics_names_the_step_that_changed_them(cli, planted) -> None:
    result = _run(cli, _pipeline(planted, "planted.scale_add", settings='verify = "numerics"\n'))
    assert result.exit_code == 1, result.output
    error = result.stderr.splitlines()[-1]
    assert error.startswith("planted.toml: steps[0] (planted.scale_add) changed numerics: max |diff| ")
    assert error.endswith(" (reproducer: passkit-repro/04-planted.scale_add)")


def test_exit_2_on_a_bad_option_before_anything_runs(cli, planted) -> None:
    result = _run(cli, _pipeline(planted, "planted.scale_add", options="factor = 2\n"))
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == "planted.toml: steps[0] (planted.scale_add).factor: unknown option; planted.scale_add takes no options\n"


def test_exit_3_when_a_raising_step_fell_back_to_eager(cli, planted) -> None:
    result = _run(cli, _pipeline(planted, "planted.explode", settings='on_error = "eager"\n'))
    assert result.exit_code == 3, result.output
    assert result.stdout.splitlines()[-1].startswith(
        "FELL BACK TO EAGER: planted.toml on planted_bugs:tiny (training): nothing was compiled, so eager was compared "
        "with itself; the compile failed: planted.toml: steps[0] (planted.explode) failed: RuntimeError: planted failure"
    )


def test_exit_4_when_a_step_raises(cli, planted) -> None:
    result = _run(cli, _pipeline(planted, "planted.explode"))
    assert (result.exit_code, result.stdout.count("ok: ")) == (4, 0), result.output
    assert result.stderr.splitlines()[-1] == (
        "planted.toml: steps[0] (planted.explode) failed: RuntimeError: planted failure "
        "(after: functionalize, decompose, joint) (reproducer: passkit-repro/04-planted.explode)"
    )


def test_exit_4_from_bisect_when_the_first_bad_step_raises(cli, planted) -> None:
    result = cli.invoke(main, ["bisect", _pipeline(planted, "planted.explode"), "--model", "planted_bugs:tiny"])
    assert result.exit_code == 4, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "first bad step: planted.toml: steps[0] (planted.explode)"
    assert lines[1].startswith("  graph 1, training: crash: planted.toml: steps[0] (planted.explode) failed: RuntimeError: planted failure")


def test_exit_4_from_repro_when_the_step_raises_again_and_1_when_it_changes_numerics_again(cli, planted) -> None:
    raised = _run(cli, _pipeline(planted, "planted.explode"))
    assert raised.exit_code == 4, raised.output
    replayed = cli.invoke(main, ["repro", "passkit-repro/04-planted.explode"])
    assert replayed.exit_code == 4, replayed.output
    assert replayed.stdout.startswith(
        "reproduced (crash): passkit-repro/04-planted.explode/pipeline.toml: steps[3] (planted.explode) failed: "
        "RuntimeError: planted failure"
    )
    changed = _run(cli, _pipeline(planted, "planted.scale_add", settings='verify = "numerics"\n'))
    assert changed.exit_code == 1, changed.output
    replayed = cli.invoke(main, ["repro", "passkit-repro/04-planted.scale_add"])
    assert replayed.exit_code == 1, replayed.output
    assert replayed.stdout.startswith("reproduced (numerics): ")
    assert replayed.stdout.rstrip().endswith(" (rtol 0.0001, atol 1e-05)")


def test_exit_2_from_validate_and_explain_on_a_bad_file_and_0_on_a_good_one(cli, planted) -> None:
    (planted / "bad.toml").write_text('[pipeline]\nname = "bad"\nextends = "nope.toml"\n')
    for command in ("validate", "explain"):
        assert cli.invoke(main, [command, FIXED_TRAINING]).exit_code == 0
        result = cli.invoke(main, [command, "bad.toml"])
        assert result.exit_code == 2, result.output


def test_a_step_that_raises_writes_its_verdict_into_the_html_report(cli, planted) -> None:
    result = cli.invoke(main, ["run", _pipeline(planted, "planted.explode"), "--model", "planted_bugs:tiny", "--report", "run.html"])
    assert result.exit_code == 4, result.output
    page = (planted / "run.html").read_text()
    assert '<p class="verdict bad"><b>verdict: STEP FAILED, exit code 4</b></p>' in page
    assert "<p>planted.toml: steps[0] (planted.explode) failed: RuntimeError: planted failure" in page


def test_a_fallback_to_eager_writes_its_verdict_into_the_html_report(cli, planted) -> None:
    file = _pipeline(planted, "planted.explode", settings='on_error = "eager"\n')
    result = cli.invoke(main, ["run", file, "--model", "planted_bugs:tiny", "--report", "run.html"])
    assert result.exit_code == 3, result.output
    page = (planted / "run.html").read_text()
    assert '<p class="verdict bad"><b>verdict: FELL BACK TO EAGER (rtol 0.0001, atol 1e-05), exit code 3</b></p>' in page
    assert "<p>the compile failed: planted.toml: steps[0] (planted.explode) failed: RuntimeError: planted failure" in page
