"""A reproducer never writes outside its own folder: replaying one leaves the failing run's
``--report`` page with its "STEP FAILED" verdict, and writes no report, dump or reproducer
anywhere, even when its ``pipeline.toml`` asks for them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import planted_bugs
from passkit.cli import main

EXPLODING = '[pipeline]\nname = "exploding"\nextends = "training-python"\n\n[[steps]]\npass = "planted.explode"\nafter = "functionalize"\n'


def _files(root: Path) -> dict[str, int]:
    return {str(path.relative_to(root)): path.stat().st_mtime_ns for path in root.rglob("*") if path.is_file()}


@pytest.fixture
def failed_run(register_passkit_plugin, tmp_path: Path) -> tuple[Path, Path]:
    """A ``passkit run --report`` whose step raised: its page and its reproducer."""
    register_passkit_plugin(planted_bugs, name="planted_bugs")
    Path("exploding.toml").write_text(EXPLODING)
    page = tmp_path / "reports" / "run.html"
    result = CliRunner().invoke(main, ["run", "exploding.toml", "--model", "planted_bugs:tiny", "--report", str(page)])
    assert result.exit_code == 4, result.output
    assert "STEP FAILED" in page.read_text()
    found = re.search(r"\(reproducer: (?P<folder>[^)]+)\)", result.stderr)
    assert found is not None, result.stderr
    return page, Path(found["folder"])


def test_the_reproducers_pipeline_writes_no_report(failed_run) -> None:
    _, folder = failed_run
    assert re.search(r'^report = ""$', (folder / "pipeline.toml").read_text(), re.MULTILINE)


def test_replaying_keeps_the_failing_runs_page_and_writes_nothing_outside_the_folder(failed_run, tmp_path: Path) -> None:
    page, folder = failed_run
    toml = folder / "pipeline.toml"
    # As an older passkit wrote it, and more: the failing run's page, dumps, reproducers.
    text = re.sub(r'^report = ""$', f'report = "{page}"', toml.read_text(), flags=re.MULTILINE)
    text = re.sub(r'^dump = "off"$', 'dump = "all"', text, flags=re.MULTILINE)
    text = re.sub(r'^dump_dir = .*$', f'dump_dir = "{tmp_path / "dumps"}"', text, flags=re.MULTILINE)
    toml.write_text(text + "")
    before_page = page.read_text()
    everywhere = {"tmp": _files(tmp_path), "cwd": _files(Path.cwd())}
    result = CliRunner().invoke(main, ["repro", str(folder), "--plugin", "planted_bugs"])
    assert result.exit_code == 4, result.output
    assert result.stdout.startswith("reproduced (crash): ")
    assert page.read_text() == before_page and "STEP FAILED" in before_page
    assert {"tmp": _files(tmp_path), "cwd": _files(Path.cwd())} == everywhere
    assert not (tmp_path / "dumps").exists()
    assert os.listdir(folder.parent) == [folder.name]
