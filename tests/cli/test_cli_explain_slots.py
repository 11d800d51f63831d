"""``passkit explain`` on a mounted file says which file set a step's slot once: in the set-by
column, and beside the slot only when another file (an overlay) set it."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from passkit.cli import main

SLOTS = '[pipeline]\nname = "slots"\n\n[[steps]]\npass = "fx.cse"\nslot = "post_grad_pre"\n'
MOVED = '[pipeline]\nname = "moved"\nextends = "slots.toml"\n\n[override."fx.cse"]\nslot = "post_grad_post"\n'


def _step_rows(text: str) -> list[str]:
    lines = text.splitlines()
    return [" ".join(line.split()) for line in lines[lines.index("steps:") + 3:]]


def test_a_slot_set_by_the_steps_own_file_is_named_once() -> None:
    Path("slots.toml").write_text(SLOTS)
    result = CliRunner().invoke(main, ["explain", "slots.toml"])
    assert result.exit_code == 0, result.output
    assert _step_rows(result.stdout) == ["1 fx.cse [slot post_grad_pre] - slots.toml"]


def test_a_slot_an_overlay_set_names_the_overlay() -> None:
    Path("slots.toml").write_text(SLOTS)
    Path("moved.toml").write_text(MOVED)
    result = CliRunner().invoke(main, ["explain", "moved.toml"])
    assert result.exit_code == 0, result.output
    assert _step_rows(result.stdout) == ["1 fx.cse [slot post_grad_post, set by moved.toml] - slots.toml"]
