"""Every mistake in a pipeline file is one line that starts with the file name; pin each one."""

from __future__ import annotations

import pytest

from passkit.errors import PasskitError, PipelineError
from passkit.pipeline import load_pipeline

TRAINING_PYTHON = "[[steps]]\npass = 'codegen.python'\n"

CASES = {
    "malformed TOML": (
        '[pipeline]\nname = "x"\n[[steps]]\npass = fx.dce\n',
        "x.toml:4:8: invalid TOML: Invalid value",
    ),
    "TOML cut off at the end": (
        '[pipeline]\nname = "x',
        "x.toml:2:10: invalid TOML: Unterminated string",
    ),
    "unknown top-level table": (
        "[setings]\nverify = 'facts'\n",
        "x.toml: unknown table [setings]; did you mean [settings]?",
    ),
    "unknown array of tables": (
        "[[step]]\npass = 'fx.dce'\n",
        "x.toml: unknown table [[step]]; did you mean [[steps]]?",
    ),
    "settings key at top level": (
        "verify = 'facts'\n",
        "x.toml: verify: put this key under [settings]",
    ),
    "disable at top level": (
        "disable = ['fx.dce']\n",
        "x.toml: disable: put this key under [pipeline]",
    ),
    "steps written as a table": (
        "[steps]\npass = 'fx.dce'\n",
        "x.toml: steps: expected an array of tables; write [[steps]]",
    ),
    "unknown key in settings": (
        "[settings]\nverfy = 'facts'\n",
        "x.toml: settings.verfy: unknown key; did you mean 'verify'?",
    ),
    "unknown key in settings, nothing close": (
        "[settings]\ncolour = 'red'\n",
        "x.toml: settings.colour: unknown key; settings are verify, dump, dump_dir, on_error, repro_dir, report, rtol, atol, cache, cache_wait",
    ),
    "bad settings value": (
        "[settings]\nverify = 'on'\n",
        "x.toml: settings.verify: Input should be 'off', 'facts' or 'numerics'",
    ),
    "unknown key in [pipeline]": (
        "[pipeline]\nextend = 'base.toml'\n",
        "x.toml: pipeline.extend: unknown key; did you mean 'extends'?",
    ),
    "unknown pass": (
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'fx.dcee'\n",
        "x.toml: steps[1]: unknown pass 'fx.dcee'; did you mean 'fx.dce'?",
    ),
    "unknown pass, nothing close": (
        "[[steps]]\npass = 'acme.fold'\n",
        "x.toml: steps[0]: unknown pass 'acme.fold'; 'passkit passes' lists the registered passes",
    ),
    "missing pass key": (
        "[[steps]]\npas = 'functionalize'\n",
        "x.toml: steps[0]: missing key 'pass'; is 'pas' a typo?",
    ),
    "unknown option": (
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'decompose'\ntabels = ['core_aten']\n",
        "x.toml: steps[1] (decompose).tabels: unknown option; did you mean 'tables'?",
    ),
    "unknown option, nothing close": (
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'decompose'\nzzz = 1\n",
        "x.toml: steps[1] (decompose).zzz: unknown option; decompose takes tables, keep, extra",
    ),
    "option for a pass without options": (
        "[[steps]]\npass = 'fx.dce'\nrounds = 2\n",
        "x.toml: steps[0] (fx.dce).rounds: unknown option; fx.dce takes no options",
    ),
    "misspelt step key": (
        "[[steps]]\npass = 'fx.dce'\nenabeld = false\n",
        "x.toml: steps[0] (fx.dce).enabeld: unknown option; did you mean 'enabled'?",
    ),
    "option of the wrong type": (
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'functionalize'\nid = 'again'\n"
        "[[steps]]\npass = 'decompose'\ntables = 'core_aten'\n",
        "x.toml: steps[2] (decompose).tables: Input should be a valid list",
    ),
    "wrong type inside a list option": (
        "[[steps]]\npass = 'decompose'\ntables = [1]\n",
        "x.toml: steps[0] (decompose).tables[0]: expected a string, got an integer (1)",
    ),
    "option rejected by the pass's validator": (
        "[[steps]]\npass = 'partition.torch_min_cut'\nmemory_budget = 1.5\n",
        "x.toml: steps[0] (partition.torch_min_cut).memory_budget: must be between 0 and 1",
    ),
    "bad when": (
        "[[steps]]\npass = 'fx.dce'\nwhen = 'train'\n",
        "x.toml: steps[0] (fx.dce).when: Input should be 'training' or 'inference'",
    ),
    "bad enabled": (
        "[[steps]]\npass = 'fx.dce'\nenabled = 'no'\n",
        "x.toml: steps[0] (fx.dce).enabled: expected a boolean, got a string (\"no\")",
    ),
    "bad id": (
        "[[steps]]\npass = 'fx.dce'\nid = 'my dce'\n",
        "x.toml: steps[0] (fx.dce).id: use letters, digits, '.', '_' and '-' only",
    ),
    "option typo in a step with an id": (
        "[[steps]]\npass = 'fx.dce'\nid = 'clean'\naftr = 'x'\n",
        "x.toml: steps[0] (clean: fx.dce).aftr: unknown option; did you mean 'after'?",
    ),
    "duplicate explicit step id": (
        "[[steps]]\npass = 'fx.dce'\nid = 'clean'\n[[steps]]\npass = 'fx.cse'\nid = 'clean'\n",
        "x.toml: steps[1] (clean: fx.cse): duplicate step id 'clean' (already used by x.toml: steps[0] (clean: fx.dce)); "
        'set a distinct id, e.g. id = "clean.2"',
    ),
    "duplicate step id": (
        "[[steps]]\npass = 'fx.dce'\n[[steps]]\npass = 'fx.dce'\n",
        "x.toml: steps[1] (fx.dce): duplicate step id 'fx.dce' (already used by x.toml: steps[0] (fx.dce)); "
        'set a distinct id, e.g. id = "fx.dce.2"',
    ),
    "missing fact: partition before joint": (
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'partition.default'\n"
        "[[steps]]\npass = 'joint'\n[[steps]]\npass = 'codegen.python'\n",
        "x.toml: steps[1] (partition.default): requires fact 'joint', which no earlier step produces; "
        "add a 'joint' step before it",
    ),
    "missing fact with two producers": (
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'acme.after_partition'\n",
        "x.toml: steps[1] (acme.after_partition): requires fact 'partitioned', which no earlier step produces; "
        "add a 'partition.default' or 'partition.torch_min_cut' step before it",
    ),
    "missing fact, invalidated earlier": (
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'joint'\n[[steps]]\npass = 'partition.default'\n"
        "[[steps]]\npass = 'partition.torch_min_cut'\n[[steps]]\npass = 'codegen.python'\n",
        "x.toml: steps[3] (partition.torch_min_cut): requires fact 'joint', "
        "which the earlier step 'partition.default' invalidates",
    ),
    "missing fact, producer disabled": (
        "[pipeline]\ndisable = ['functionalize']\n"
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'decompose'\n[[steps]]\npass = 'codegen.python'\n",
        "x.toml: steps[1] (decompose): requires fact 'functional', which no earlier step produces "
        "(step 'functionalize' is disabled (by x.toml))",
    ),
    "no step produces compiled": (
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'fx.dce'\n",
        "x.toml: no step produces fact 'compiled'; end the pipeline with a codegen step such as 'codegen.python'",
    ),
    "extends a missing file": (
        "[pipeline]\nextends = 'nope.toml'\n",
        "x.toml: extends: pipeline file not found: nope.toml",
    ),
    "extends an unknown pipeline name": (
        "[pipeline]\nextends = 'trainng'\n",
        "x.toml: extends: unknown pipeline 'trainng'; did you mean 'training'?",
    ),
    "extends itself": (
        "[pipeline]\nextends = 'x.toml'\n",
        "x.toml: extends cycle: x.toml -> x.toml",
    ),
}


@pytest.mark.parametrize("text, expected", list(CASES.values()), ids=list(CASES))
def test_error_message(write, registry, tmp_path, text, expected):
    registry.pipelines["training"] = write("training.toml", "[[steps]]\npass = 'codegen.python'\n")
    path = write("x.toml", text)
    with pytest.raises(PipelineError) as info:
        load_pipeline(str(path), registry=registry)
    assert str(info.value) == expected
    assert "\n" not in str(info.value)


def test_pipeline_error_is_a_passkit_error(write, registry):
    write("x.toml", "[setings]\n")
    with pytest.raises(PasskitError):
        load_pipeline("x.toml", registry=registry)


def test_extends_cycle_names_every_file(write, registry):
    write("a.toml", "[pipeline]\nextends = 'b.toml'\n")
    write("b.toml", "[pipeline]\nextends = 'sub/c.toml'\n")
    write("sub/c.toml", "[pipeline]\nextends = '../a.toml'\n")
    with pytest.raises(PipelineError) as info:
        load_pipeline("a.toml", registry=registry)
    assert str(info.value) == "a.toml: extends cycle: a.toml -> b.toml -> sub/c.toml -> a.toml"


def test_extends_path_is_relative_to_the_extending_file(write, registry):
    write("sub/a.toml", "[pipeline]\nextends = 'nope.toml'\n")
    with pytest.raises(PipelineError) as info:
        load_pipeline("sub/a.toml", registry=registry)
    assert str(info.value) == "sub/a.toml: extends: pipeline file not found: sub/nope.toml"


def test_missing_file(write, registry):
    with pytest.raises(PipelineError) as info:
        load_pipeline("nope.toml", registry=registry)
    assert str(info.value) == "passkit: pipeline file not found: nope.toml"


@pytest.mark.parametrize("written", ["training-python.toml", "training-pyton.toml"], ids=["exact", "misspelt"])
@pytest.mark.parametrize("extends", [True, False], ids=["from-extends", "from-the-command-line"])
def test_a_registered_pipeline_written_as_a_file_name_is_suggested_by_name(write, registry, extends, written):
    registry.pipelines["training-python"] = write("lib/training-python.toml", "[[steps]]\npass = 'codegen.python'\n")
    write("x.toml", f"[pipeline]\nextends = '{written}'\n")
    with pytest.raises(PipelineError) as info:
        load_pipeline("x.toml" if extends else written, registry=registry)
    prefix = "x.toml: extends" if extends else "passkit"
    assert str(info.value) == (
        f"{prefix}: pipeline file not found: {written}; "
        "did you mean the pipeline 'training-python' (a name, without .toml)?"
    )


def test_a_missing_file_suggests_a_close_file_beside_it_then_a_close_pipeline(write, registry):
    registry.pipelines["training"] = write("lib/training.toml", "[[steps]]\npass = 'codegen.python'\n")
    write("base.toml", TRAINING_PYTHON)
    write("x.toml", "[pipeline]\nextends = 'bsae.toml'\n")
    write("y.toml", "[pipeline]\nextends = 'trainig.toml'\n")
    with pytest.raises(PipelineError) as info:
        load_pipeline("x.toml", registry=registry)
    assert str(info.value) == "x.toml: extends: pipeline file not found: bsae.toml; did you mean 'base.toml'?"
    with pytest.raises(PipelineError) as info:
        load_pipeline("y.toml", registry=registry)
    assert str(info.value) == (
        "y.toml: extends: pipeline file not found: trainig.toml; did you mean the pipeline 'training' (a name, without .toml)?"
    )


def test_a_missing_file_outside_the_working_directory_is_shown_normalised(write, registry, tmp_path, monkeypatch):
    write("bad/x.toml", "[pipeline]\nextends = '../base/missing.toml'\n")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    with pytest.raises(PipelineError) as info:
        load_pipeline(str(tmp_path / "bad" / "x.toml"), registry=registry)
    assert str(info.value) == f"{tmp_path}/bad/x.toml: extends: pipeline file not found: {tmp_path}/base/missing.toml"


def test_unknown_pipeline_name(write, registry):
    registry.pipelines["training"] = write("training.toml", "[[steps]]\npass = 'codegen.python'\n")
    with pytest.raises(PipelineError) as info:
        load_pipeline("trainng", registry=registry)
    assert str(info.value) == "passkit: unknown pipeline 'trainng'; did you mean 'training'?"


def test_unknown_pipeline_name_lists_the_registered_ones(write, registry):
    registry.pipelines["training"] = write("training.toml", "[[steps]]\npass = 'codegen.python'\n")
    with pytest.raises(PipelineError) as info:
        load_pipeline("zzz", registry=registry)
    assert str(info.value) == "passkit: unknown pipeline 'zzz'; registered pipelines: training"


def test_unknown_pass_mentions_plugins_that_failed(write, registry):
    registry.failed_plugins["acme"] = "failed to import: ModuleNotFoundError: No module named 'nope'"
    write("x.toml", "[[steps]]\npass = 'acme.fold'\n")
    with pytest.raises(PipelineError) as info:
        load_pipeline("x.toml", registry=registry)
    assert str(info.value) == (
        "x.toml: steps[0]: unknown pass 'acme.fold'; 'passkit passes' lists the registered passes "
        "(plugins that failed to load: acme)"
    )


OVERLAY_CASES = {
    "override an unknown id": (
        "[override.decomp]\ntables = ['core_aten']\n",
        "over.toml: override.decomp: no step with id 'decomp'; did you mean 'decompose'?",
    ),
    "override with an unquoted dotted id": (
        "[override.fx.dce]\nenabled = false\n",
        "over.toml: override.fx: no step with id 'fx'; quote ids that contain dots: [override.\"fx.dce\"]",
    ),
    "override with a bad option value": (
        "[override.decompose]\ntables = 'core_aten'\n",
        "over.toml: override.decompose.tables: Input should be a valid list",
    ),
    "override with an unknown option": (
        "[override.decompose]\nkeeep = ['aten.gelu.default']\n",
        "over.toml: override.decompose.keeep: unknown option; did you mean 'keep'?",
    ),
    "override of a dotted id with a bad when": (
        "[override.\"fx.dce\"]\nwhen = 'sometimes'\n",
        "over.toml: override.\"fx.dce\".when: Input should be 'training' or 'inference'",
    ),
    "override that changes the pass": (
        "[override.decompose]\npass = 'fx.cse'\n",
        "over.toml: override.decompose.pass: cannot be overridden; disable the step and add a new one",
    ),
    "insert after an unknown id": (
        "[[steps]]\npass = 'fx.cse'\nafter = 'jiont'\n",
        "over.toml: steps[0] (fx.cse).after: no step with id 'jiont'; did you mean 'joint'?",
    ),
    "insert with both anchors": (
        "[[steps]]\npass = 'fx.cse'\nafter = 'joint'\nbefore = 'joint'\n",
        "over.toml: steps[0] (fx.cse): set either before or after, not both",
    ),
    "insert a step whose id the base uses": (
        "[[steps]]\npass = 'fx.dce'\n",
        "over.toml: steps[0] (fx.dce): duplicate step id 'fx.dce' (already used by base.toml: steps[4] (fx.dce)); "
        'set a distinct id, e.g. id = "fx.dce.2"',
    ),
    "insert a step that breaks a contract": (
        "[[steps]]\npass = 'partition.default'\nid = 'early'\nbefore = 'joint'\n",
        "over.toml: steps[0] (early: partition.default): requires fact 'joint', which no earlier step produces; "
        "add a 'joint' step before it",
    ),
    "disable an unknown id": (
        "[pipeline]\ndisable = ['fx.dc']\n",
        "over.toml: pipeline.disable[0]: no step with id 'fx.dc'; did you mean 'fx.dce'?",
    ),
    "disable the only codegen step": (
        "[pipeline]\ndisable = ['codegen.python']\n",
        "over.toml: no step produces fact 'compiled' (step 'codegen.python' is disabled (by over.toml))",
    ),
}


@pytest.mark.parametrize("text, expected", list(OVERLAY_CASES.values()), ids=list(OVERLAY_CASES))
def test_overlay_errors_name_the_overlay(base, write, registry, text, expected):
    if "[pipeline]" in text:
        text = text.replace("[pipeline]\n", "[pipeline]\nextends = 'base.toml'\n")
    else:
        text = "[pipeline]\nextends = 'base.toml'\n" + text
    write("over.toml", text)
    with pytest.raises(PipelineError) as info:
        load_pipeline("over.toml", registry=registry)
    assert str(info.value) == expected


def test_errors_in_the_base_name_the_base(write, registry):
    write("base.toml", "[[steps]]\npass = 'fx.dcee'\n")
    write("over.toml", "[pipeline]\nextends = 'base.toml'\n")
    with pytest.raises(PipelineError) as info:
        load_pipeline("over.toml", registry=registry)
    assert str(info.value) == "base.toml: steps[0]: unknown pass 'fx.dcee'; did you mean 'fx.dce'?"


def test_loading_never_runs_code_from_the_file(write, registry, tmp_path):
    marker = tmp_path / "ran"
    write(
        "x.toml",
        f"""
        [pipeline]
        description = "__import__('pathlib').Path({str(marker)!r}).touch()"
        [[steps]]
        pass = "codegen.python"
        """,
    )
    pipeline = load_pipeline("x.toml", registry=registry)
    assert pipeline.description.startswith("__import__")
    assert not marker.exists()


def test_the_docs_error_table_shows_the_missing_extends_file_as_the_message_does(write, registry):
    # docs/pipelines.md once said the path was shown relative to the extending file.
    from pathlib import Path

    write("sub/a.toml", "[pipeline]\nextends = 'nope.toml'\n")
    with pytest.raises(PipelineError) as info:
        load_pipeline("sub/a.toml", registry=registry)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
    row = next(line for line in docs.splitlines() if line.startswith("| missing file |"))
    assert f"`{info.value}`" in row
    assert "relative to the working directory" in row
