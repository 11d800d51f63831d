"""docs/debugging.md: the ``passkit bisect`` example prints what the page shows.

The page's ``bad.toml`` (the ``training`` pipeline plus ``acme.fuse``) is run with the planted
``planted.scale_add`` in place of ``acme.fuse`` and ``planted_bugs:tiny`` as the model; every
line of the page's output must come out, the max |diff| aside (the page's model is not ours).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from passkit.cli import main

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "debugging.md"
SECTION = re.compile(r"^## `passkit bisect`\n(.*?)^### ", re.MULTILINE | re.DOTALL)
TOML = re.compile(r"^```toml\n(.*?)^```", re.MULTILINE | re.DOTALL)
CONSOLE = re.compile(r"^```\n\$ (.*?)\n(.*?)^```", re.MULTILINE | re.DOTALL)
PLANTED = {"acme.fuse": "planted.scale_add", "acme_passes": "planted_bugs", "mymodels:block": "planted_bugs:tiny"}
DIFF = re.compile(r"max \|diff\| [0-9.e+-]+")


def _planted(text: str) -> str:
    for theirs, ours in PLANTED.items():
        text = text.replace(theirs, ours)
    return text


def test_the_bisect_example_on_training_prints_the_page_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (section,) = SECTION.findall(DOC.read_text(encoding="utf-8"))
    (pipeline,) = TOML.findall(section)
    (command, shown), *_ = CONSOLE.findall(section)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PASSKIT_REPRO_DIR", "passkit-repro")  # as the page's examples set it
    (tmp_path / "bad.toml").write_text(_planted(pipeline))
    args = _planted(command).split()
    assert args[:2] == ["passkit", "bisect"]
    result = CliRunner().invoke(main, args[1:])
    assert result.exit_code == 1, result.output
    expected = DIFF.sub("max |diff| X", _planted(shown)).splitlines()
    printed = DIFF.sub("max |diff| X", result.stderr + result.stdout).splitlines()
    assert [line for line in printed if line.startswith("bisect: ")] + [
        line for line in printed if not line.startswith("bisect: ")
    ] == expected
    assert "codegen.inductor" in expected[-2]
