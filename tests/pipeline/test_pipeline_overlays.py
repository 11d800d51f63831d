"""``extends`` overlays: override, before/after insertion, disable, and the provenance of values."""

from __future__ import annotations

from pathlib import Path

import pytest

from passkit.errors import PipelineError
from passkit.pipeline import Pipeline, is_pipeline_name, load_pipeline


def ids(pipeline: Pipeline) -> list[str]:
    return [step.id for step in pipeline.steps]


def test_base_file_loads_in_order_with_defaults(base, registry):
    pipeline = load_pipeline("base.toml", registry=registry)
    assert ids(pipeline) == ["functionalize", "decompose", "joint", "partition.default", "fx.dce", "codegen.python"]
    assert [step.position for step in pipeline.steps] == [0, 1, 2, 3, 4, 5]
    assert pipeline.name == "train"
    assert pipeline.description == "test training pipeline"
    assert pipeline.can_train
    assert pipeline.source == Path("base.toml")
    assert pipeline.files == (Path("base.toml"),)
    decompose = pipeline.step("decompose")
    assert decompose.options.tables == ["core_aten"]
    assert decompose.location == "base.toml: steps[1] (decompose)"


def test_override_changes_options_by_id_and_records_the_overlay(base, write, registry):
    write(
        "over.toml",
        """
        [pipeline]
        extends = "base.toml"

        [override.decompose]
        keep = ["aten.gelu.default"]
        """,
    )
    pipeline = load_pipeline("over.toml", registry=registry)
    decompose = pipeline.step("decompose")
    assert decompose.options.keep == ["aten.gelu.default"]
    assert decompose.options.tables == ["core_aten"]
    assert decompose.origin == {
        "pass": "base.toml",
        "when": "<default>",
        "enabled": "<default>",
        "keep": "over.toml",
        "tables": "<default>",
        "extra": "<default>",
    }


def test_override_merges_with_options_the_base_set(write, registry):
    write(
        "base.toml",
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'decompose'\ntables = ['a']\n"
        "keep = ['k']\n[[steps]]\npass = 'codegen.python'\n",
    )
    write("over.toml", "[pipeline]\nextends = 'base.toml'\n[override.decompose]\ntables = ['b']\n")
    decompose = load_pipeline("over.toml", registry=registry).step("decompose")
    assert (decompose.options.tables, decompose.options.keep) == (["b"], ["k"])
    assert (decompose.origin["tables"], decompose.origin["keep"]) == ("over.toml", "base.toml")


def test_override_when_and_enabled(base, write, registry):
    write(
        "over.toml",
        """
        [pipeline]
        extends = "base.toml"

        [override."fx.dce"]
        when = "inference"
        enabled = false
        """,
    )
    step = load_pipeline("over.toml", registry=registry).step("fx.dce")
    assert (step.when, step.enabled) == ("inference", False)
    assert (step.origin["when"], step.origin["enabled"]) == ("over.toml", "over.toml")


def test_steps_insert_before_and_after_ids_and_append_without_anchor(base, write, registry):
    write(
        "over.toml",
        """
        [pipeline]
        extends = "base.toml"

        [[steps]]
        pass = "fx.cse"
        id = "cse.first"
        after = "joint"

        [[steps]]
        pass = "fx.cse"
        id = "cse.second"
        after = "joint"

        [[steps]]
        pass = "fx.dce"
        id = "dce.early"
        before = "decompose"

        [[steps]]
        pass = "fx.cse"
        id = "cse.last"
        """,
    )
    pipeline = load_pipeline("over.toml", registry=registry)
    assert ids(pipeline) == [
        "functionalize",
        "dce.early",
        "decompose",
        "joint",
        "cse.first",
        "cse.second",
        "partition.default",
        "fx.dce",
        "codegen.python",
        "cse.last",
    ]
    assert [step.position for step in pipeline.steps] == list(range(10))
    inserted = pipeline.step("cse.second")
    assert inserted.origin["pass"] == "over.toml"
    assert inserted.location == "over.toml: steps[1] (cse.second: fx.cse)"


def test_an_inserted_step_can_anchor_on_an_earlier_inserted_one(base, write, registry):
    write(
        "over.toml",
        "[pipeline]\nextends = 'base.toml'\n"
        "[[steps]]\npass = 'fx.cse'\nafter = 'joint'\n[[steps]]\npass = 'fx.dce'\nid = 'd2'\nbefore = 'fx.cse'\n",
    )
    assert ids(load_pipeline("over.toml", registry=registry))[2:5] == ["joint", "d2", "fx.cse"]


def test_disable_keeps_the_step_but_turns_it_off(base, write, registry):
    write("over.toml", "[pipeline]\nextends = 'base.toml'\ndisable = ['fx.dce', 'decompose']\n")
    pipeline = load_pipeline("over.toml", registry=registry)
    assert [step.id for step in pipeline.steps if not step.enabled] == ["decompose", "fx.dce"]
    assert pipeline.step("fx.dce").origin["enabled"] == "over.toml"


def test_an_overlay_can_enable_a_step_the_base_disabled(base, write, registry):
    write("mid.toml", "[pipeline]\nextends = 'base.toml'\ndisable = ['fx.dce']\n")
    write("top.toml", "[pipeline]\nextends = 'mid.toml'\n[override.\"fx.dce\"]\nenabled = true\n")
    pipeline = load_pipeline("top.toml", registry=registry)
    assert pipeline.step("fx.dce").enabled
    assert pipeline.step("fx.dce").origin["enabled"] == "top.toml"
    assert pipeline.files == (Path("base.toml"), Path("mid.toml"), Path("top.toml"))


def test_disabling_joint_makes_an_inference_pipeline(base, write, registry):
    write("over.toml", "[pipeline]\nextends = 'base.toml'\ndisable = ['joint']\n")
    assert not load_pipeline("over.toml", registry=registry).can_train


def test_settings_merge_key_by_key_with_origins(write, registry):
    write("base.toml", "[settings]\nverify = 'facts'\ndump = 'all'\n[[steps]]\npass = 'codegen.python'\n")
    write("over.toml", "[pipeline]\nextends = 'base.toml'\n[settings]\ndump = 'changed'\n")
    pipeline = load_pipeline("over.toml", registry=registry)
    assert pipeline.settings.model_dump() == {
        "verify": "facts",
        "dump": "changed",
        "dump_dir": "passkit-dump",
        "on_error": "raise",
        "repro_dir": None,
        "report": "",
        "rtol": 1e-4,
        "atol": 1e-5,
        "cache": "on",
        "cache_wait": 600.0,
    }
    assert pipeline.settings_origin == {
        "verify": "base.toml",
        "dump": "over.toml",
        "dump_dir": "<default>",
        "on_error": "<default>",
        "repro_dir": "<default>",
        "report": "<default>",
        "rtol": "<default>",
        "atol": "<default>",
        "cache": "<default>",
        "cache_wait": "<default>",
    }


def test_name_and_description(base, write, registry):
    write("over.toml", "[pipeline]\nextends = 'base.toml'\n")
    pipeline = load_pipeline("over.toml", registry=registry)
    assert (pipeline.name, pipeline.description) == ("over", "test training pipeline")
    write("named.toml", "[pipeline]\nextends = 'base.toml'\nname = 'fast'\ndescription = 'faster'\n")
    pipeline = load_pipeline("named.toml", registry=registry)
    assert (pipeline.name, pipeline.description) == ("fast", "faster")


def test_extends_a_registered_pipeline_by_name(base, write, registry):
    registry.pipelines["train"] = base.resolve()
    write("sub/over.toml", "[pipeline]\nextends = 'train'\ndisable = ['fx.dce']\n")
    pipeline = load_pipeline("sub/over.toml", registry=registry)
    assert pipeline.files == (base.resolve(), Path("sub/over.toml"))
    assert pipeline.step("decompose").origin["pass"] == "base.toml"


def test_load_by_name_by_path_or_pipeline(base, registry):
    registry.pipelines["train"] = base
    by_name = load_pipeline("train", registry=registry)
    by_path = load_pipeline(Path("base.toml"), registry=registry)
    assert ids(by_name) == ids(by_path)
    assert load_pipeline(by_name, registry=registry) is by_name


def test_a_path_without_toml_suffix_is_a_path(write, registry):
    write("plain", "[[steps]]\npass = 'codegen.python'\n")
    assert ids(load_pipeline(Path("plain"), registry=registry)) == ["codegen.python"]
    assert ids(load_pipeline("./plain", registry=registry)) == ["codegen.python"]


@pytest.mark.parametrize(
    "text, expected",
    [("training", True), ("training.toml", False), ("sub/training", False), ("./x", False)],
)
def test_is_pipeline_name(text, expected):
    assert is_pipeline_name(text) is expected


def test_explain_shows_every_value_and_the_file_that_set_it(write, registry):
    write(
        "base.toml",
        "[pipeline]\ndescription = 'base'\n[settings]\nverify = 'facts'\n"
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'decompose'\n[[steps]]\npass = 'codegen.python'\n",
    )
    write(
        "over.toml",
        "[pipeline]\nextends = 'base.toml'\ndisable = ['functionalize']\n"
        "[override.decompose]\ntables = ['mine']\n[[steps]]\npass = 'functionalize'\nid = 'f2'\n"
        "before = 'decompose'\nwhen = 'inference'\n",
    )
    assert load_pipeline("over.toml", registry=registry).explain() == {
        "name": "over",
        "description": "base",
        "source": "over.toml",
        "files": ["base.toml", "over.toml"],
        "kind": "compile",
        "can_train": False,
        "settings": {
            "verify": {"value": "facts", "from": "base.toml"},
            "dump": {"value": "off", "from": "<default>"},
            "dump_dir": {"value": "passkit-dump", "from": "<default>"},
            "on_error": {"value": "raise", "from": "<default>"},
            "repro_dir": {"value": None, "from": "<default>"},
            "report": {"value": "", "from": "<default>"},
            "rtol": {"value": 1e-4, "from": "<default>"},
            "atol": {"value": 1e-5, "from": "<default>"},
            "cache": {"value": "on", "from": "<default>"},
            "cache_wait": {"value": 600.0, "from": "<default>"},
        },
        "steps": [
            {
                "number": 1,
                "position": 0,
                "id": "functionalize",
                "pass": "functionalize",
                "when": None,
                "enabled": False,
                "from": {"pass": "base.toml", "when": "<default>", "enabled": "over.toml"},
                "options": {},
                "tolerance": None,
            },
            {
                "number": 2,
                "position": 1,
                "id": "f2",
                "pass": "functionalize",
                "when": "inference",
                "enabled": True,
                "from": {"pass": "over.toml", "when": "over.toml", "enabled": "<default>"},
                "options": {},
                "tolerance": None,
            },
            {
                "number": 3,
                "position": 2,
                "id": "decompose",
                "pass": "decompose",
                "when": None,
                "enabled": True,
                "from": {"pass": "base.toml", "when": "<default>", "enabled": "<default>"},
                "options": {
                    "tables": {"value": ["mine"], "from": "over.toml"},
                    "keep": {"value": [], "from": "<default>"},
                    "extra": {"value": [], "from": "<default>"},
                },
                "tolerance": None,
            },
            {
                "number": 4,
                "position": 3,
                "id": "codegen.python",
                "pass": "codegen.python",
                "when": None,
                "enabled": True,
                "from": {"pass": "base.toml", "when": "<default>", "enabled": "<default>"},
                "options": {},
                "tolerance": None,
            },
        ],
    }


def test_with_settings_validates_and_records_the_argument(base, registry):
    pipeline = load_pipeline("base.toml", registry=registry)
    changed = pipeline.with_settings(verify="numerics", dump_dir=Path("out"), dump=None)
    assert (changed.settings.verify, changed.settings.dump_dir, changed.settings.dump) == ("numerics", "out", "off")
    assert changed.settings_origin["verify"] == "<argument>"
    assert changed.settings_origin["dump"] == "<default>"
    assert pipeline.settings.verify == "off"  # the original is untouched
    with pytest.raises(PipelineError) as info:
        pipeline.with_settings(verfy="facts")
    assert str(info.value) == "passkit: unknown setting 'verfy'; did you mean 'verify'?"
    with pytest.raises(PipelineError) as info:
        pipeline.with_settings(on_error="ignore")
    assert str(info.value) == "passkit: settings.on_error: Input should be 'raise' or 'eager'"


def test_fingerprint_follows_the_plan_not_the_settings(base, write, registry):
    plain = load_pipeline("base.toml", registry=registry)
    assert plain.fingerprint() == load_pipeline("base.toml", registry=registry).fingerprint()
    assert plain.with_settings(dump="all").fingerprint() == plain.fingerprint()
    write("over.toml", "[pipeline]\nextends = 'base.toml'\n[override.decompose]\nkeep = ['aten.gelu.default']\n")
    assert load_pipeline("over.toml", registry=registry).fingerprint() != plain.fingerprint()


def _list_base(write) -> None:
    write(
        "base.toml",
        "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'decompose'\ntables = ['core_aten']\n"
        "keep = ['aten.gelu.default', 'aten.mm.default']\n[[steps]]\npass = 'codegen.python'\n",
    )


def test_an_overlay_adds_to_and_removes_from_an_inherited_list(write, registry):
    _list_base(write)
    write(
        "over.toml",
        "[pipeline]\nextends = 'base.toml'\n[override.decompose]\n"
        "keep.add = ['aten.silu.default', 'aten.gelu.default']\nkeep.remove = ['aten.mm.default']\n",
    )
    decompose = load_pipeline("over.toml", registry=registry).step("decompose")
    # Removes apply first; an item already present stays where it was.
    assert decompose.options.keep == ["aten.gelu.default", "aten.silu.default"]
    assert decompose.origin["keep"] == "over.toml"
    assert (decompose.origin["keep[0]"], decompose.origin["keep[1]"]) == ("base.toml", "over.toml")


def test_list_edits_chain_through_several_overlays(write, registry):
    _list_base(write)
    write("mid.toml", "[pipeline]\nextends = 'base.toml'\n[override.decompose]\nkeep.add = ['aten.silu.default']\n")
    write("top.toml", "[pipeline]\nextends = 'mid.toml'\n[override.decompose]\nkeep.add = ['aten.tanh.default']\n")
    decompose = load_pipeline("top.toml", registry=registry).step("decompose")
    assert decompose.options.keep == ["aten.gelu.default", "aten.mm.default", "aten.silu.default", "aten.tanh.default"]
    assert [decompose.origin[f"keep[{i}]"] for i in range(4)] == ["base.toml", "base.toml", "mid.toml", "top.toml"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            "keep.remove = ['aten.mn.default']",
            "over.toml: override.decompose.keep.remove[0]: 'aten.mn.default' is not in the list; "
            "did you mean 'aten.mm.default'?",
        ),
        (
            "keep.adds = ['aten.silu.default']",
            "over.toml: override.decompose.keep.adds: unknown list edit; did you mean 'add'?",
        ),
        ("keep.add = 'aten.silu.default'", "over.toml: override.decompose.keep.add: expected a list of items"),
        ("keep.add = [3]", "over.toml: override.decompose.keep[2]: expected a string, got an integer (3)"),
    ],
)
def test_bad_list_edits_are_one_line_errors(write, registry, edit, message):
    _list_base(write)
    write("over.toml", f"[pipeline]\nextends = 'base.toml'\n[override.decompose]\n{edit}\n")
    with pytest.raises(PipelineError) as caught:
        load_pipeline("over.toml", registry=registry)
    assert str(caught.value) == message
