"""`passkit validate` and `passkit explain`."""

from __future__ import annotations

import json

import pytest

from passkit.cli import main
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.core.plugins import make_plugin_manager
from passkit.core.program import Program
from passkit.core.registry import build_registry


def test_validate_reports_each_file_and_exits_0_when_all_are_valid(cli, registry, workdir, good_toml) -> None:
    (workdir / "good.toml").write_text(good_toml)
    (workdir / "also.toml").write_text(good_toml.replace("limit = 7", "limit = 8"))
    result = cli.invoke(main, ["validate", "good.toml", "also.toml"])
    assert (result.exit_code, result.stdout, result.stderr) == (
        0, "ok  good.toml (3 steps)\nok  also.toml (3 steps)\n", ""
    )


def test_validate_keeps_going_after_an_invalid_file_and_exits_2(cli, registry, workdir, good_toml) -> None:
    (workdir / "bad.toml").write_text(good_toml.replace("limit = 7", "limt = 7"))
    (workdir / "good.toml").write_text(good_toml)
    result = cli.invoke(main, ["validate", "bad.toml", "missing.toml", "good.toml"])
    assert result.exit_code == 2
    assert result.stdout == "ok  good.toml (3 steps)\n"
    assert result.stderr == (
        "bad.toml: steps[1] (t.fold).limt: unknown option; did you mean 'limit'?\n"
        "passkit: pipeline file not found: missing.toml\n"
    )
    assert "Traceback" not in result.output


def test_validate_names_the_missing_fact(cli, registry, workdir, good_toml) -> None:
    (workdir / "order.toml").write_text(good_toml.replace('[[steps]]\npass = "t.functional"\n\n', ""))
    result = cli.invoke(main, ["validate", "order.toml"])
    assert result.exit_code == 2
    assert result.stderr == (
        "order.toml: steps[0] (t.fold): requires fact 'functional', which no earlier step produces; "
        "add a 't.functional' step before it\n"
    )


def test_validate_json_has_one_object_per_file(cli, registry, workdir, good_toml) -> None:
    (workdir / "good.toml").write_text(good_toml)
    result = cli.invoke(main, ["validate", "--json", "good.toml", "missing.toml"])
    assert result.exit_code == 2
    assert json.loads(result.stdout) == [
        {"file": "good.toml", "ok": True, "steps": 3, "error": None},
        {"file": "missing.toml", "ok": False, "steps": None, "error": "passkit: pipeline file not found: missing.toml"},
    ]


def test_explain_shows_where_each_value_came_from(cli, registry, workdir, good_toml) -> None:
    (workdir / "good.toml").write_text(good_toml)
    (workdir / "child.toml").write_text(
        '[pipeline]\nname = "child"\nextends = "good.toml"\n'
        '[settings]\ndump = "all"\n'
        '[override."t.fold"]\nkeep = []\n'
    )
    result = cli.invoke(main, ["explain", "child.toml"])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "pipeline child (child.toml)\n"
        "  functionalize, fold, compile\n"
        "files: good.toml -> child.toml\n"
        "\n"
        "settings:\n"
        "key         value           set by\n"
        "----------  --------------  ----------\n"
        'verify      "facts"         good.toml\n'
        'dump        "all"           child.toml\n'
        'dump_dir    "passkit-dump"  <default>\n'
        'on_error    "raise"         <default>\n'
        "repro_dir   none            <default>\n"
        'report      ""              <default>\n'
        "rtol        0.0001          <default>\n"
        "atol        1e-05           <default>\n"
        'cache       "on"            <default>\n'
        "cache_wait  600.0           <default>\n"
        "\n"
        "steps:\n"
        "#  step          tolerance  set by\n"
        "-  ------------  ---------  ----------\n"
        "1  t.functional  -          good.toml\n"
        "2  t.fold        -          good.toml\n"
        "     limit = 7              good.toml\n"
        "     keep = []              child.toml\n"
        "3  t.codegen     -          good.toml\n"
    )


def test_explain_json_is_the_pipelines_own_plan(cli, registry, workdir, good_toml) -> None:
    (workdir / "good.toml").write_text(good_toml)
    result = cli.invoke(main, ["explain", "--json", "good.toml"])
    assert result.exit_code == 0
    plan = json.loads(result.stdout)
    assert plan["settings"]["verify"] == {"value": "facts", "from": "good.toml"}
    assert plan["steps"][1]["options"]["limit"] == {"value": 7, "from": "good.toml"}
    assert plan["steps"][1]["options"]["keep"] == {"value": ["aten.gelu"], "from": "<default>"}


def test_explain_marks_disabled_and_conditional_steps(cli, registry, workdir, good_toml) -> None:
    (workdir / "good.toml").write_text(good_toml)
    (workdir / "child.toml").write_text(
        '[pipeline]\nname = "child"\nextends = "good.toml"\ndisable = ["t.fold"]\n'
        '[[steps]]\npass = "t.fold"\nid = "late-fold"\nwhen = "training"\nbefore = "t.codegen"\n'
    )
    result = cli.invoke(main, ["explain", "child.toml"])
    assert result.exit_code == 0, result.output
    steps = result.stdout.split("steps:\n")[1]
    assert steps == (
        "#  step                                       tolerance  set by\n"
        "-  -----------------------------------------  ---------  ----------\n"
        "1  t.functional                               -          good.toml\n"
        "2  t.fold [disabled by child.toml]            -          good.toml\n"
        "     limit = 7                                           good.toml\n"
        '     keep = ["aten.gelu"]                                <default>\n'
        "3  late-fold (pass t.fold) [when = training]  -          child.toml\n"
        "     limit = 100                                         <default>\n"
        '     keep = ["aten.gelu"]                                <default>\n'
        "4  t.codegen                                  -          good.toml\n"
    )


def test_explain_shows_long_lists_one_item_per_row() -> None:
    from click.testing import CliRunner

    from passkit.cli import main

    result = CliRunner().invoke(main, ["explain", "training-python"])
    assert result.exit_code == 0
    lines = [line.rstrip() for line in result.output.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("keep = ["))
    assert lines[start].endswith(" passkit/pipelines/training-python.toml")  # wherever passkit is installed
    assert lines[start + 1].strip() == '"aten.native_layer_norm.default",'
    steps_table = lines[lines.index("steps:") :]
    assert max(len(line) for line in steps_table) < 100


def test_explain_shows_which_file_added_each_item_of_an_edited_list(cli, registry, workdir, good_toml) -> None:
    (workdir / "good.toml").write_text(good_toml.replace("limit = 7", 'limit = 7\nkeep = ["aten.gelu", "aten.mm"]'))
    (workdir / "child.toml").write_text(
        '[pipeline]\nextends = "good.toml"\n[override."t.fold"]\nkeep.add = ["aten.silu"]\nkeep.remove = ["aten.mm"]\n'
    )
    result = cli.invoke(main, ["explain", "child.toml"])
    assert result.exit_code == 0, result.output
    fold = result.stdout.split("steps:\n")[1].splitlines()[3:8]
    assert fold == [
        "2  t.fold            -          good.toml",
        "     limit = 7                  good.toml",
        "     keep = [                   child.toml",
        '       "aten.gelu",             good.toml',
        '       "aten.silu",             child.toml',
    ]
    plan = json.loads(cli.invoke(main, ["explain", "--json", "child.toml"]).stdout)
    assert plan["steps"][1]["options"]["keep"] == {
        "value": ["aten.gelu", "aten.silu"], "from": "child.toml", "items_from": ["good.toml", "child.toml"],
    }


def _fast_tolerance(options) -> tuple[float, float] | None:
    """Loose only with fast math on."""
    return (1e-2, 1e-3) if options.fast else None


@graph_pass("t.approx", requires={"functional"}, tolerance=(1e-3, 1e-4))
def approx(program: Program) -> bool:
    """Approximate on purpose."""
    return False


@graph_pass("t.maybe_fast", requires={"functional"}, tolerance=_fast_tolerance)
def maybe_fast(program: Program, *, fast: bool = False) -> bool:
    """Approximate only when asked."""
    return False


@graph_pass("t.functional", produces={"functional"})
def functional(program: Program) -> bool:
    """Pretend to functionalize."""
    return False


@graph_pass("t.codegen", produces={"compiled"})
def codegen(program: Program) -> bool:
    """Pretend to compile."""
    return False


@pytest.fixture
def approximating(monkeypatch):
    """A registry of passes of which two declare a tolerance, one of them per options."""

    class Approximating:
        @hookimpl
        def passkit_register_passes(self) -> list:
            return [functional, approx, maybe_fast, codegen]

    pm = make_plugin_manager(load_entry_points=False, builtins=False)
    pm.register(Approximating(), name="approx")
    built = build_registry(pm)
    monkeypatch.setattr("passkit.core.registry.get_registry", lambda: built)
    return built


TOLERANT = """\
[pipeline]
name = "tolerant"

[[steps]]
pass = "t.functional"

[[steps]]
pass = "t.approx"

[[steps]]
pass = "t.maybe_fast"
id = "exact"

[[steps]]
pass = "t.maybe_fast"
id = "fast"
fast = true

[[steps]]
pass = "t.codegen"
"""


def test_explain_shows_each_steps_declared_tolerance(cli, approximating, workdir) -> None:
    (workdir / "tolerant.toml").write_text(TOLERANT)
    result = cli.invoke(main, ["explain", "tolerant.toml"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split("steps:\n")[1] == (
        "#  step                       tolerance                set by\n"
        "-  -------------------------  -----------------------  -------------\n"
        "1  t.functional               -                        tolerant.toml\n"
        "2  t.approx                   rtol=0.001, atol=0.0001  tolerant.toml\n"
        "3  exact (pass t.maybe_fast)  -                        tolerant.toml\n"
        "     fast = false                                      <default>\n"
        "4  fast (pass t.maybe_fast)   rtol=0.01, atol=0.001    tolerant.toml\n"
        "     fast = true                                       tolerant.toml\n"
        "5  t.codegen                  -                        tolerant.toml\n"
    )
    plan = json.loads(cli.invoke(main, ["explain", "--json", "tolerant.toml"]).stdout)
    assert [(step["id"], step["tolerance"]) for step in plan["steps"]] == [
        ("t.functional", None),
        ("t.approx", {"rtol": 0.001, "atol": 0.0001}),
        ("exact", None),
        ("fast", {"rtol": 0.01, "atol": 0.001}),
        ("t.codegen", None),
    ]
