"""docs/writing-passes.md works as written: its files, its commands and its code.

The tutorial's file blocks (a ```python or ```toml block whose first line is ``# <path>``) are
written into a project folder, its plugin module is registered in the process-wide plugin
manager as if ``pip install -e .`` had installed it, and then every ``$ passkit`` command of its
``console`` blocks is run and compared with the output the doc shows (``...`` stands for any
text), every other ```python block is executed in order, and ``$ pytest tests`` runs the doc's
test file with pytester.
"""

from __future__ import annotations

import importlib
import os
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from click.testing import CliRunner

import passkit
import passkit.core.registry
from passkit.core import plugins
from passkit.cli import main

pytest_plugins = ["pytester"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "writing-passes.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
FILE_HEADER = re.compile(r"# ([\w./-]+\.(?:py|toml))\n")
PLUGIN_NAME = "acme"
DISTRIBUTION = ("acme-passes", "0.1.0")


@dataclass(frozen=True)
class Block:
    lang: str
    text: str

    @property
    def path(self) -> str | None:
        """The file this block is, from its ``# path`` first line; None for a snippet."""
        match = FILE_HEADER.match(self.text)
        return match.group(1) if match and self.lang in ("python", "toml") else None


@dataclass(frozen=True)
class Command:
    argv: list[str]
    expected: list[str]

    def __str__(self) -> str:
        return " ".join(self.argv)


def doc_blocks() -> list[Block]:
    return [Block(m.group(1), m.group(2)) for m in FENCE.finditer(DOC.read_text(encoding="utf-8"))]


def doc_commands() -> list[Command]:
    """Each ``$ command`` of the console blocks with the output lines shown under it."""
    commands: list[Command] = []
    for block in doc_blocks():
        if block.lang != "console":
            continue
        for line in block.text.splitlines():
            if line.startswith("$ "):
                commands.append(Command(shlex.split(line[2:]), []))
            else:
                commands[-1].expected.append(line)
    return commands


def passkit_args(argv: list[str]) -> list[str] | None:
    """The arguments after ``passkit`` or ``python -m passkit``; None for other programs."""
    if argv[:1] == ["passkit"]:
        return argv[1:]
    if argv[:3] == ["python", "-m", "passkit"]:
        return argv[3:]
    return None


def line_pattern(expected: str) -> re.Pattern[str]:
    """``...`` matches any text and a run of spaces any run of spaces (table widths vary)."""
    parts = [r"\s+".join(re.escape(word) for word in piece.split()) for piece in expected.split("...")]
    return re.compile(".*".join(parts))


def assert_output_matches(expected: list[str], actual: str) -> None:
    lines = [line.rstrip() for line in actual.splitlines()]
    if "..." not in expected and not any("..." in line for line in expected):
        assert lines == expected
        return
    position = 0
    for wanted in expected:
        if wanted == "...":
            continue
        pattern = line_pattern(wanted.strip())
        while position < len(lines) and not pattern.fullmatch(lines[position].strip()):
            position += 1
        assert position < len(lines), f"no line matching {wanted!r} (in order) in:\n{actual}"
        position += 1


@pytest.fixture(scope="module")
def project_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Any]]:
    """The tutorial's project folder, importable, with its plugin module imported."""
    root = tmp_path_factory.mktemp("acme-passes")
    for block in doc_blocks():
        if block.path:
            target = root / block.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text, encoding="utf-8")
    # "Once the plugin ships the file as acme_passes/pipelines/fold.toml ..."
    (root / "acme_passes" / "pipelines").mkdir()
    (root / "acme_passes" / "pipelines" / "fold.toml").write_text((root / "fold.toml").read_text())
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module("acme_passes")
        _warm_up_tracing()
        yield root, module
    finally:
        sys.path.remove(str(root))
        for name in ("acme_passes", "acme_models"):
            sys.modules.pop(name, None)


@pytest.fixture
def project(project_files: tuple[Path, Any]) -> Path:
    """The project folder as cwd, its plugin registered as if installed (for this test only:
    the suite's isolation fixture resets the plugin manager and the cwd afterwards)."""
    root, module = project_files
    plugins.get_plugin_manager().register_plugin(module, PLUGIN_NAME, distribution=DISTRIBUTION)
    os.chdir(root)
    return root


def _warm_up_tracing() -> None:
    """Import the tracing stack now: pytester drops modules first imported during its runs."""
    from passkit.frontends.capture import program_from_function
    from passkit.verify.evaluate import Reference
    from passkit.core.registry import get_registry

    x = torch.ones(2, requires_grad=True)
    program = program_from_function(lambda x: (-(-x)).sin(), [x])
    reference = Reference(program, [x])
    for name in ("functionalize", "joint"):
        get_registry().get_pass(name).run(program)
    reference.compare(program)


def test_doc_has_the_files_of_its_layout() -> None:
    paths = sorted(block.path for block in doc_blocks() if block.path)
    assert paths == ["acme_models.py", "acme_passes/__init__.py", "fold.toml", "pyproject.toml", "tests/test_fold.py"]


def test_pyproject_points_the_entry_point_at_the_plugin_module(project: Path) -> None:
    config = tomllib.loads((project / "pyproject.toml").read_text())
    assert config["project"]["entry-points"]["passkit"] == {PLUGIN_NAME: "acme_passes"}
    assert config["project"]["dependencies"] == ["passkit"]
    assert (config["project"]["name"], config["project"]["version"]) == DISTRIBUTION
    assert config["tool"]["setuptools"]["packages"] == ["acme_passes"]


PASSKIT_COMMANDS = [c for c in doc_commands() if passkit_args(c.argv) is not None]


def test_doc_shows_the_commands_it_promises() -> None:
    assert [str(c) for c in doc_commands()] == [
        "pip install -e .",
        "passkit passes",
        "passkit validate fold.toml",
        "python -m passkit run fold.toml --model acme_models:tiny",
        "pytest tests",
    ]


@pytest.mark.parametrize("command", PASSKIT_COMMANDS, ids=str)
def test_passkit_command_prints_what_the_doc_shows(project: Path, command: Command) -> None:
    result = CliRunner().invoke(main, passkit_args(command.argv))
    assert result.exit_code == 0, result.stderr
    assert_output_matches(command.expected, result.stdout)


def test_code_runs_compiles_both_negations_away_and_matches_eager(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, Any] = {"__name__": "writing_passes_doc"}
    for block in doc_blocks():
        if block.lang == "python" and block.path is None:
            exec(compile(block.text, f"{DOC.name} snippet", "exec"), namespace)
    printed = capsys.readouterr().out

    assert namespace["step"].stats == {"rewrites": 2}
    assert printed.rstrip().endswith("{'rewrites': 2}")
    assert "rewrites=2" in printed  # the report table's notes column
    fn, x, w = namespace["fn"], namespace["x"], namespace["w"]
    w_eager = w.detach().clone().requires_grad_()
    expected = fn(x, w_eager)
    expected.backward()
    torch.testing.assert_close(namespace["loss"], expected)
    torch.testing.assert_close(w.grad, w_eager.grad)


def _quick_start() -> tuple[str, list[str], str]:
    """The notebook quick start: its code, the report it shows, and the error it shows."""
    (code,) = [b.text for b in doc_blocks() if b.lang == "python" and '"pipeline": {"extends"' in b.text]
    (table,) = [b.text.splitlines() for b in doc_blocks() if b.lang == "text" and b.text.startswith("pipeline nb ")]
    (error,) = [b.text.strip() for b in doc_blocks() if b.lang == "text" and b.text.startswith("nb.py:")]
    return code, table, error


def test_the_notebook_quick_start_needs_no_plugin_and_matches_eager(capsys: pytest.CaptureFixture[str]) -> None:
    code, table, _ = _quick_start()
    assert "acme.fold_double_neg" not in passkit.core.registry.get_registry().passes  # nothing installed
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(code, "nb.py", "exec"), namespace)  # the notebook, saved as nb.py
    assert_output_matches(table, capsys.readouterr().out)

    model, compiled = namespace["model"], namespace["compiled"]
    eager = namespace["Tiny"]()
    eager.load_state_dict(model.state_dict())
    for module in (model, eager):
        module.zero_grad()
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), eager(x))
    compiled(x).sum().backward()
    eager(x).sum().backward()
    torch.testing.assert_close(model.linear.weight.grad, eager.linear.weight.grad)


def test_the_notebook_quick_start_names_its_line_in_the_doc_error() -> None:
    code, _, error = _quick_start()
    assert '"max_rewrites": 10' in code
    with pytest.raises(passkit.PipelineError) as raised:
        exec(compile(code.replace('"max_rewrites": 10', '"max_rewrites": "ten"'), "nb.py", "exec"), {"__name__": "__main__"})
    assert str(raised.value) == error
    line = error.split(":")[1]
    assert code.splitlines()[int(line) - 1].startswith("compiled = passkit.compile(model, pipeline=pipeline)")
    assert f"`nb.py:{line}` where a file would show its name" in DOC.read_text(encoding="utf-8")


def test_bad_option_is_rejected_with_the_doc_message(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (message,) = [b.text.strip() for b in doc_blocks() if b.lang == "text" and b.text.startswith("fold.toml:")]
    fold = (project / "fold.toml").read_text()
    assert "max_rewrites = 100" in fold
    (tmp_path / "fold.toml").write_text(fold.replace("max_rewrites = 100", 'max_rewrites = "many"'))
    monkeypatch.chdir(tmp_path)

    with pytest.raises(passkit.PipelineError) as raised:
        passkit.load_pipeline("fold.toml")
    assert str(raised.value) == message


def test_shipped_pipeline_is_found_by_name(project: Path) -> None:
    pipeline = passkit.load_pipeline("fold")
    ids = [step.id for step in pipeline.steps]
    assert ids[ids.index("joint") + 1] == "acme.fold_double_neg"
    assert pipeline.source == project / "acme_passes" / "pipelines" / "fold.toml"


def test_doc_tests_pass_with_the_pytest_plugin(project: Path, pytester: pytest.Pytester) -> None:
    (command,) = [c for c in doc_commands() if c.argv[:1] == ["pytest"]]
    (summary,) = [m for line in command.expected if (m := re.fullmatch(r"(\d+) passed\.\.\.", line))]
    tests = pytester.mkdir("tests")
    (tests / "test_fold.py").write_text((project / "tests" / "test_fold.py").read_text())

    recorder = pytester.inline_run("-p", "no:cacheprovider", "tests")

    recorder.assertoutcome(passed=int(summary.group(1)))


def _block(lang: str, containing: str) -> Block:
    (found,) = [block for block in doc_blocks() if block.lang == lang and containing in block.text]
    return found


NUMBER = r"\d\.\de[-+]\d\d"


def test_the_tanh_gelu_example_is_ok_in_run_and_bisect_on_the_shipped_model(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, register_passkit_plugin: Any
) -> None:
    namespace: dict[str, Any] = {"__name__": "writing_passes_tanh_gelu"}
    exec(compile(_block("python", '"acme.tanh_gelu"').text, f"{DOC.name} tanh_gelu", "exec"), namespace)

    class TanhPlugin:
        @passkit.hookimpl
        def passkit_register_passes(self) -> list[Any]:
            return [namespace["tanh_gelu"]]

    register_passkit_plugin(TanhPlugin(), name="acme_tanh")
    monkeypatch.chdir(tmp_path)
    Path("tanh.toml").write_text(_block("toml", 'pass = "acme.tanh_gelu"').text)
    shown = _block("text", "ok: tanh.toml on").text.strip()

    result = CliRunner().invoke(main, ["run", "tanh.toml"])
    assert result.exit_code == 0, result.output
    verdict = result.stdout.splitlines()[-1]
    assert re.fullmatch(re.escape(shown).replace(re.escape("1.6e-04"), NUMBER).replace(re.escape("3.3e-03"), NUMBER), verdict), verdict
    # The doc's reason for its atol: the gradients move by more than 1e-3, and less than 5e-3.
    grads = float(re.search(rf"grads max \|diff\| ({NUMBER})", verdict).group(1))
    assert 1e-3 < grads < 5e-3
    bisected = CliRunner().invoke(main, ["bisect", "tanh.toml"])
    assert bisected.exit_code == 0, bisected.output
    assert bisected.stdout.startswith("every step is good: tanh.toml"), bisected.stdout
