"""``--plugin MODULE`` works wherever a pass that is not installed may be named: ``validate`` and
``explain`` take it, ``repro`` names the module its manifest recorded and the option that
registers it, and the minimal pipeline ``bisect`` writes says to run it with the same
``--plugin``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import passkit
import planted_bugs
from passkit.cli import main
from passkit.core.plugins import get_plugin_manager

EXPLODING = '[pipeline]\nname = "exploding"\nextends = "training-python"\n\n[[steps]]\npass = "planted.explode"\nafter = "functionalize"\n'


@pytest.fixture
def exploding() -> Path:
    path = Path("exploding.toml")
    path.write_text(EXPLODING)
    return path


def test_validate_and_explain_take_plugin(cli, exploding: Path) -> None:
    unknown = cli.invoke(main, ["validate", "exploding.toml"])
    assert unknown.exit_code == 2 and "unknown pass 'planted.explode'" in unknown.stderr
    validated = cli.invoke(main, ["validate", "exploding.toml", "--plugin", "planted_bugs"])
    assert (validated.exit_code, validated.stdout) == (0, "ok  exploding.toml (12 steps)\n")
    explained = cli.invoke(main, ["explain", "exploding.toml", "--plugin", "planted_bugs"])
    assert explained.exit_code == 0, explained.output
    assert re.search(r"^2\s+planted\.explode\s", explained.stdout, re.MULTILINE), explained.stdout


def _reproducer(exploding: Path) -> str:
    pm = get_plugin_manager()
    pm.register(planted_bugs, name="planted_bugs")
    try:
        with pytest.raises(passkit.PasskitError) as raised:
            passkit.aot_function(lambda x: x.sin() * 2, pipeline=str(exploding))(torch.randn(4, requires_grad=True))
    finally:
        pm.unregister(name="planted_bugs")
    return re.search(r"\(reproducer: (?P<folder>[^)]+)\)$", str(raised.value))["folder"]


def test_repro_of_a_pass_that_is_not_registered_names_its_module_and_plugin(cli, exploding: Path) -> None:
    folder = _reproducer(exploding)
    for command in (["repro", folder], ["bisect", "--repro", folder]):
        result = cli.invoke(main, command)
        assert (result.exit_code, result.stderr) == (2, (
            f"{folder}: the failing step's pass 'planted.explode' is not registered; the reproducer recorded it from "
            f"module 'planted_bugs': install its plugin, or name the module with --plugin planted_bugs\n"))
    replayed = cli.invoke(main, ["repro", folder, "--plugin", "planted_bugs"])
    assert replayed.exit_code == 4, replayed.output
    assert replayed.stdout.startswith("reproduced (crash): ")


FIXED_TRAINING = str(Path(__file__).resolve().parents[1] / "debug" / "fixed_training.toml")
PLANTED = f'[pipeline]\nname = "planted"\nextends = "{FIXED_TRAINING}"\n\n[[steps]]\npass = "planted.scale_add"\nafter = "joint"\n'


@pytest.mark.slow
def test_bisects_minimal_pipeline_says_to_run_it_with_the_plugin(cli) -> None:
    Path("planted.toml").write_text(PLANTED)
    result = cli.invoke(main, ["bisect", "planted.toml", "--model", "planted_bugs:tiny", "--plugin", "planted_bugs"])
    assert result.exit_code == 1, result.output
    comment = [line for line in Path("planted-minimal.toml").read_text().splitlines() if line.startswith("# Run it")]
    assert comment == ["# Run it with `passkit run planted-minimal.toml --model planted_bugs:tiny --plugin planted_bugs`; "
                       "it fails at its last step."]
