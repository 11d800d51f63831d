"""`passkit passes` and `passkit pipelines`: text and JSON listings."""

from __future__ import annotations

import json
import re
from pathlib import Path

from passkit.cli import main
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.plugins import make_plugin_manager
from passkit.core.program import Program
from passkit.core.registry import build_registry


def test_passes_lists_contract_options_and_summary(cli, registry) -> None:
    result = cli.invoke(main, ["passes"])
    assert result.exit_code == 0
    assert result.stdout == (
        "t.codegen  (plugin clitest)\n"
        "  Pretend to compile.\n"
        "  requires: -; produces: compiled; invalidates: -\n"
        "  options: none\n"
        "\n"
        "t.fold  (plugin clitest)\n"
        "  Fold constant expressions.\n"
        "  requires: functional; produces: -; invalidates: -\n"
        "  option limit: int = 100\n"
        '  option keep: list[str] = ["aten.gelu"]\n'
        "\n"
        "t.functional  (plugin clitest)\n"
        "  Pretend to functionalize.\n"
        "  requires: -; produces: functional; invalidates: -\n"
        "  options: none\n"
    )
    assert result.stderr == ""


def test_passes_json_describes_each_pass(cli, registry) -> None:
    result = cli.invoke(main, ["passes", "--json"])
    assert result.exit_code == 0
    listed = {entry["name"]: entry for entry in json.loads(result.stdout)}
    assert sorted(listed) == ["t.codegen", "t.fold", "t.functional"]
    fold = listed["t.fold"]
    assert fold == {
        "name": "t.fold",
        "plugin": "clitest",
        "distribution": "",
        "summary": "Fold constant expressions.",
        "requires": ["functional"],
        "produces": [],
        "invalidates": [],
        "training_only": False,
        "version": "1",
        "tolerance": None,
        "options": [
            {"name": "limit", "type": "int", "default": 100, "required": False},
            {"name": "keep", "type": "list[str]", "default": ["aten.gelu"], "required": False},
        ],
        "fingerprint": fold["fingerprint"],
    }
    assert re.fullmatch(r"t\.fold@1:[0-9a-f]{16}", fold["fingerprint"])


def test_passes_show_a_declared_tolerance(cli, monkeypatch) -> None:
    @graph_pass("t.gelu_tanh", tolerance=(1e-3, 1e-4))
    def gelu_tanh(program: Program) -> bool:
        """Approximate GELU with tanh."""
        return False

    class Approximate:
        @hookimpl
        def passkit_register_passes(self) -> list:
            return [gelu_tanh]

    pm = make_plugin_manager(load_entry_points=False, builtins=False)
    pm.register(Approximate(), name="approx")
    built = build_registry(pm)
    monkeypatch.setattr("passkit.core.registry.get_registry", lambda: built)
    text = cli.invoke(main, ["passes"])
    assert text.exit_code == 0
    assert text.stdout == (
        "t.gelu_tanh  (plugin approx)\n"
        "  Approximate GELU with tanh.\n"
        "  requires: -; produces: -; invalidates: -\n"
        "  tolerance: rtol=0.001, atol=0.0001\n"
        "  options: none\n"
    )
    listed = cli.invoke(main, ["passes", "--json"])
    assert json.loads(listed.stdout)[0]["tolerance"] == {"rtol": 0.001, "atol": 0.0001}


def test_passes_json_names_the_distribution_of_builtins(cli) -> None:
    result = cli.invoke(main, ["passes", "--json"])
    assert result.exit_code == 0
    dce = next(entry for entry in json.loads(result.stdout) if entry["name"] == "fx.dce")
    assert (dce["plugin"], dce["distribution"]) == ("fx_cleanup", "passkit")


def test_pipelines_lists_name_description_and_file(cli, registry, workdir) -> None:
    (workdir / "fast.toml").write_text(
        '[pipeline]\nname = "fast"\ndescription = "just compile"\n[[steps]]\npass = "t.codegen"\n'
    )
    (workdir / "broken.toml").write_text("[pipeline\n")
    registry.pipelines.update({"fast": Path("fast.toml"), "broken": Path("broken.toml")})
    result = cli.invoke(main, ["pipelines"])
    assert result.exit_code == 0
    assert result.stdout == (
        "name    description                                                                              file\n"
        "------  ---------------------------------------------------------------------------------------  -----------\n"
        "broken  invalid: broken.toml:1:10: invalid TOML: Expected ']' at the end of a table declaration  broken.toml\n"
        "fast    just compile                                                                             fast.toml\n"
    )
    rows = json.loads(cli.invoke(main, ["pipelines", "--json"]).stdout)
    assert rows[1] == {"name": "fast", "description": "just compile", "file": "fast.toml"}


def test_pipelines_says_when_there_are_none(cli, registry) -> None:
    result = cli.invoke(main, ["pipelines"])
    assert (result.exit_code, result.stdout) == (0, "no pipelines registered\n")


def test_pipelines_shows_installed_files_relative_to_their_package(tmp_path, monkeypatch) -> None:
    from passkit.pipeline.messages import display_path

    package = tmp_path / "site" / "acme_pkg" / "pipelines"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert display_path(package / "fast.toml") == "acme_pkg/pipelines/fast.toml"
    assert display_path(elsewhere / "mine.toml") == "mine.toml"
    assert display_path(tmp_path / "loose.toml") == str(tmp_path / "loose.toml")  # nothing shorter is true


def test_passes_shows_a_tolerance_declared_per_options(cli) -> None:
    listed = cli.invoke(main, ["passes", "--json"])
    assert listed.exit_code == 0, listed.output
    rewrite = next(entry for entry in json.loads(listed.stdout) if entry["name"] == "rewrite")
    assert rewrite["tolerance"] == "per options"
    text = cli.invoke(main, ["passes"]).stdout.splitlines()
    assert "  tolerance: per options (The loosest of the pattern sets the step applies)" in text
