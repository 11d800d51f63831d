"""The one rule for random ops (``passkit.verify.compare.same_random_draws``), on a model with
dropout in train mode, through every surface that compares with eager: ``passkit run``,
``verify = "numerics"``, ``bisect``, ``repro`` and the pytest plugin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import planted_bugs
from passkit.cli import main
from passkit.verify.compare import same_random_draws

pytestmark = pytest.mark.slow

FIXED_TRAINING = str(Path(__file__).resolve().parents[1] / "debug" / "fixed_training.toml")


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


@pytest.fixture
def planted(register_passkit_plugin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PASSKIT_DEBUG", raising=False)
    return tmp_path


def test_same_random_draws_gives_each_side_eager_mask_and_restores_the_callers_generator() -> None:
    model, (x,) = planted_bugs.dropout()
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    with same_random_draws():
        eager = model(x)
    with same_random_draws():
        torch_path = torch.compile(model, backend="aot_eager")(x)  # torch's own path draws the same mask
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(eager, torch_path)
    assert not torch.equal(eager, model.eval()(x))  # dropout really dropped something


def test_run_on_a_dropout_model_is_ok_with_no_difference(cli, planted) -> None:
    for pipeline in ("training-python", FIXED_TRAINING):
        result = cli.invoke(main, ["run", pipeline, "--model", "planted_bugs:dropout"])
        assert result.exit_code == 0, result.output
        assert result.stdout.splitlines()[-1].endswith(
            "on planted_bugs:dropout (training) vs eager: outputs max |diff| 0.0e+00, grads max |diff| 0.0e+00 "
            "(rtol 0.0001, atol 1e-05)"
        )


def test_verify_numerics_on_a_dropout_model_passes_every_step_and_catches_the_planted_one(cli, planted) -> None:
    (planted / "verified.toml").write_text(
        f'[pipeline]\nname = "verified"\nextends = "{FIXED_TRAINING}"\n\n[settings]\nverify = "numerics"\n'
    )
    result = cli.invoke(main, ["run", "verified.toml", "--model", "planted_bugs:dropout"])
    assert result.exit_code == 0, result.output
    (planted / "planted.toml").write_text(
        f'[pipeline]\nname = "planted"\nextends = "{FIXED_TRAINING}"\n\n[settings]\nverify = "numerics"\n\n'
        '[[steps]]\npass = "planted.scale_add"\nafter = "partition.default"\n'
    )
    result = cli.invoke(main, ["run", "planted.toml", "--model", "planted_bugs:dropout"])
    assert result.exit_code == 1
    error = result.stderr.splitlines()[-1]
    assert error.startswith("planted.toml: steps[0] (planted.scale_add) changed numerics: max |diff| ")
    assert error.endswith(" (reproducer: passkit-repro/05-planted.scale_add)")
    # repro replays it: only the planted step differs, and by the planted scaling alone.
    replayed = cli.invoke(main, ["repro", "passkit-repro/05-planted.scale_add", "--json"])
    assert replayed.exit_code == 1
    assert json.loads(replayed.stdout)["reproduced"] is True


def test_bisect_on_a_dropout_model_finds_every_step_good_and_names_the_planted_one(cli, planted) -> None:
    result = cli.invoke(main, ["bisect", FIXED_TRAINING, "--model", "planted_bugs:dropout", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["first_bad_step"] is None
    (planted / "planted.toml").write_text(
        f'[pipeline]\nname = "planted"\nextends = "{FIXED_TRAINING}"\n\n[[steps]]\npass = "planted.scale_add"\nafter = "joint"\n'
    )
    result = cli.invoke(main, ["bisect", "planted.toml", "--model", "planted_bugs:dropout"])
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[0] == "first bad step: planted.toml: steps[0] (planted.scale_add)"


def test_pytest_plugin_holds_a_pass_on_a_dropout_program_to_eager(make_program) -> None:
    from passkit.testing import assert_pass_preserves_numerics

    model, (x,) = planted_bugs.dropout()
    program = make_program(model, x.requires_grad_(), passes=("functionalize", "decompose", "joint"))
    assert_pass_preserves_numerics("partition.default", program)
    with pytest.raises(pytest.fail.Exception, match="pass planted.scale_add changed numerics: max |diff| "):
        assert_pass_preserves_numerics(planted_bugs.scale_add, program)
