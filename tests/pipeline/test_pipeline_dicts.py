"""A dict with a pipeline file's keys is a pipeline: the same models validate it, its errors read
as a file's, starting with the Python line that handed it over, and its steps may name a
``Pass`` object that no plugin registered.

Each test runs its code as a notebook saved as ``nb.py`` in the working directory (line 1 is the
source's first line), so locations read as a user's would: ``nb.py:3``.
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path
from typing import Any

import pytest

from passkit.errors import PipelineError
from passkit.pipeline import load_pipeline
from passkit.pipeline.messages import CodeLocation

NOTEBOOK_PASS = '''
from passkit.core.pass_api import graph_pass

@graph_pass("nb.knob", requires={"functional"})
def knob(program, *, max_rewrites: int = 100) -> bool:
    """Turn a knob."""
    return False
'''


def notebook(source: str, registry: Any, **given: Any) -> dict[str, Any]:
    """Run ``source`` (dedented) as the cells of ``nb.py``, after ``NOTEBOOK_PASS``'s cell, with
    ``load`` loading against ``registry`` and the ``given`` names; returns the notebook's names."""
    names: dict[str, Any] = {"__name__": "__main__", "load": functools.partial(load_pipeline, registry=registry), **given}
    exec(compile(NOTEBOOK_PASS.lstrip("\n"), "nb_passes.py", "exec"), names)
    exec(compile(textwrap.dedent(source).lstrip("\n"), "nb.py", "exec"), names)
    return names


def notebook_error(source: str, registry: Any) -> str:
    with pytest.raises(PipelineError) as info:
        notebook(source, registry)
    assert "\n" not in str(info.value)
    return str(info.value)


STEPS = "[{'pass': 'functionalize'}, {'pass': 'decompose'}, {'pass': 'codegen.python'}]"


def test_a_dict_loads_as_the_file_with_the_same_keys_would(write, registry) -> None:
    write("same.toml", """
        [pipeline]
        name = "nb"
        [settings]
        verify = "facts"
        [[steps]]
        pass = "functionalize"
        [[steps]]
        pass = "decompose"
        keep = ["aten.gelu.default"]
        [[steps]]
        pass = "fx.dce"
        enabled = false
        [[steps]]
        pass = "codegen.python"
        """)
    found = notebook("""
        spec = {
            "settings": {"verify": "facts"},
            "steps": [{"pass": "functionalize"}, {"pass": "decompose"}, {"pass": "fx.dce"}, {"pass": "codegen.python"}],
            "override": {"decompose": {"keep": ["aten.gelu.default"]}},
            "pipeline": {"disable": ["fx.dce"]},
        }
        pipeline = load(spec)
        """, registry)
    pipeline, from_file = found["pipeline"], load_pipeline("same.toml", registry=registry)
    assert pipeline.name == "nb"  # the Python file's stem, as a file's stem names it
    assert pipeline.source == CodeLocation(Path("nb.py"), 7) and pipeline.label == "nb.py:7"
    assert [(s.id, s.enabled, dict(s.options)) for s in pipeline.steps] == [
        (s.id, s.enabled, dict(s.options)) for s in from_file.steps]
    assert pipeline.settings == from_file.settings
    assert pipeline.fingerprint() == from_file.fingerprint()  # what a plan computes, wherever it was written
    assert pipeline.step("decompose").origin["keep"] == "nb.py:7"
    assert pipeline.step("decompose").location == "nb.py:7: steps[1] (decompose)"
    assert found["spec"]["override"] == {"decompose": {"keep": ["aten.gelu.default"]}}  # the dict is left alone


DICT_ERRORS = {
    "the issue's example": (
        "load({'steps': [{'pass': knob, 'max_rewrites': 'x'}]})",
        'nb.py:1: steps[0] (nb.knob).max_rewrites: expected an integer, got a string ("x")',
    ),
    "bad setting": (
        "load({'settings': {'verify': True}, 'steps': " + STEPS + "})",
        "nb.py:1: settings.verify: expected a string, got a boolean (true)",
    ),
    "unknown setting": (
        "load({'settings': {'verfy': 'facts'}})",
        "nb.py:1: settings.verfy: unknown key; did you mean 'verify'?",
    ),
    "unknown pass": (
        "load({'steps': [{'pass': 'functionalize'}, {'pass': 'fx.dcee'}]})",
        "nb.py:1: steps[1]: unknown pass 'fx.dcee'; did you mean 'fx.dce'?",
    ),
    "unknown option": (
        "load({'steps': [{'pass': 'decompose', 'tabels': ['core_aten']}]})",
        "nb.py:1: steps[0] (decompose).tabels: unknown option; did you mean 'tables'?",
    ),
    "missing fact": (
        "load({'steps': [{'pass': knob}, {'pass': 'codegen.python'}]})",
        "nb.py:1: steps[0] (nb.knob): requires fact 'functional', which no earlier step produces; "
        "add a 'functionalize' step before it",
    ),
    "duplicate id": (
        "load({'steps': [{'pass': 'fx.dce'}, {'pass': 'fx.dce'}]})",
        "nb.py:1: steps[1] (fx.dce): duplicate step id 'fx.dce' (already used by nb.py:1: steps[0] (fx.dce)); "
        'set a distinct id, e.g. id = "fx.dce.2"',
    ),
    "override of an unknown id": (
        "load({'steps': " + STEPS + ", 'override': {'decomp': {'keep': []}}})",
        "nb.py:1: override.decomp: no step with id 'decomp'; did you mean 'decompose'?",
    ),
    "disable of an unknown id": (
        "load({'pipeline': {'disable': ['fx.dc']}, 'steps': [{'pass': 'fx.dce'}]})",
        "nb.py:1: pipeline.disable[0]: no step with id 'fx.dc'; did you mean 'fx.dce'?",
    ),
    "extends a missing file": (
        "load({'pipeline': {'extends': 'nope.toml'}})",
        "nb.py:1: extends: pipeline file not found: nope.toml",
    ),
    "extends an unknown pipeline": (
        "load({'pipeline': {'extends': 'trainng'}})",
        "nb.py:1: extends: unknown pipeline 'trainng'; did you mean 'training'?",
    ),
    "no codegen": (
        "load({'steps': [{'pass': 'functionalize'}]})",
        "nb.py:1: no step produces fact 'compiled'; end the pipeline with a codegen step such as 'codegen.python'",
    ),
    # A file's table and array mistakes, in a dict's words.
    "steps as a dict": (
        "load({'steps': {'pass': 'fx.dce'}})",
        "nb.py:1: steps: expected a list of dicts, one per step, got a dict",
    ),
    "a step that is no dict": (
        "load({'steps': ['fx.dce']})",
        "nb.py:1: steps[0]: expected a dict with a 'pass' key, got a str ('fx.dce')",
    ),
    "settings as a list": (
        "load({'settings': [('verify', 'facts')]})",
        "nb.py:1: settings: expected a dict, got a list",
    ),
    "an override that is no dict": (
        "load({'steps': " + STEPS + ", 'override': {'decompose': ['aten.mm.default']}})",
        "nb.py:1: override.decompose: expected a dict of option values, got a list",
    ),
    "a setting at the top": (
        "load({'verify': 'facts'})",
        "nb.py:1: verify: put this key in the 'settings' dict",
    ),
    "disable at the top": (
        "load({'disable': ['fx.dce']})",
        "nb.py:1: disable: put this key in the 'pipeline' dict",
    ),
    "unknown key": (
        "load({'setings': {}})",
        "nb.py:1: unknown key 'setings'; did you mean 'settings'?; a pipeline dict has pipeline, settings, steps, override",
    ),
    "a function that is no pass": (
        "def fold(program):\n    return False\nload({'steps': [{'pass': fold}]})",
        "nb.py:3: steps[0].pass: expected a pass name or a Pass, got the function 'fold'; "
        "make it a pass with @passkit.graph_pass",
    ),
    "no pass": (
        "load({'steps': [{'pas': 'fx.dce'}]})",
        "nb.py:1: steps[0]: missing key 'pass'; is 'pas' a typo?",
    ),
}


@pytest.mark.parametrize("source, expected", list(DICT_ERRORS.values()), ids=list(DICT_ERRORS))
def test_a_dicts_errors_read_as_a_files_from_the_python_line(write, registry, source, expected) -> None:
    registry.pipelines["training"] = write("training.toml", "[[steps]]\npass = 'codegen.python'\n")
    assert notebook_error(source, registry) == expected


def test_a_multi_line_dict_is_attributed_to_the_line_of_the_call(write, registry) -> None:
    message = notebook_error("""
        spec = {
            "steps": [{"pass": knob, "max_rewrites": "x"}],
        }
        pipeline = load(
            spec,
        )
        """, registry)
    assert message.startswith("nb.py:4: steps[0] (nb.knob).max_rewrites:")


def test_a_pass_object_needs_no_plugin(write, registry) -> None:
    names = notebook("pipeline = load({'steps': [{'pass': 'functionalize'}, {'pass': knob, 'max_rewrites': 3}, "
                     "{'pass': 'codegen.python'}]})", registry)
    step = names["pipeline"].step("nb.knob")
    assert step.pass_ is names["knob"] and step.options.max_rewrites == 3
    assert step.unregistered and not names["pipeline"].step("functionalize").unregistered
    assert (step.origin["pass"], step.location) == ("nb.py:1", "nb.py:1: steps[1] (nb.knob)")
    assert "nb.knob" not in registry.passes  # the registry it was loaded against is left as it was


def test_a_registered_pass_given_as_its_object_stays_registered(write, registry) -> None:
    names = notebook("pipeline = load({'steps': [{'pass': dce}, {'pass': 'codegen.python'}]})", registry,
                     dce=registry.get_pass("fx.dce"))
    assert not names["pipeline"].step("fx.dce").unregistered


def test_a_pass_named_like_a_registered_pass_is_refused_in_one_line(write, registry) -> None:
    assert notebook_error("""
        @graph_pass("fx.dce")
        def my_dce(program) -> bool:
            return False

        load({"steps": [{"pass": my_dce}]})
        """, registry) == (
        "nb.py:5: steps[0] (fx.dce): this Pass is not the registered pass 'fx.dce' of plugin 'fake_builtins' "
        "(passkit 0.1.0); give it a name of its own"
    )


def test_two_passes_of_one_name_are_refused(write, registry) -> None:
    assert notebook_error("""
        @graph_pass("nb.knob", requires={"functional"})
        def other(program) -> bool:
            return False

        load({"steps": [{"pass": "functionalize"}, {"pass": knob}, {"pass": other, "id": "again"}]})
        """, registry) == (
        "nb.py:5: steps[2] (nb.knob): another Pass named 'nb.knob' is the pass of steps[1]; give each pass a name of its own"
    )


def test_extends_names_a_pipeline_or_a_file_relative_to_the_working_directory(write, registry, base) -> None:
    registry.pipelines["train"] = base
    write("sub/over.toml", "[pipeline]\nextends = '../base.toml'\n[override.decompose]\nkeep = ['aten.mm.default']\n")
    names = notebook("""
        by_name = load({"pipeline": {"extends": "train"}, "steps": [{"pass": knob, "after": "functionalize"}]})
        by_path = load({"pipeline": {"extends": "sub/over.toml", "name": "mine"}})
        """, registry)
    by_name, by_path = names["by_name"], names["by_path"]
    assert [s.id for s in by_name.steps][:3] == ["functionalize", "nb.knob", "decompose"]
    assert by_name.files == (base, CodeLocation(Path("nb.py"), 1))
    assert by_path.name == "mine" and by_path.step("decompose").origin["keep"] == "sub/over.toml"
    assert by_path.step("functionalize").origin["pass"] == "base.toml"


def test_python_spellings_are_accepted(write, registry) -> None:
    write("base.toml", "[[steps]]\npass = 'functionalize'\n[[steps]]\npass = 'decompose'\n"
                       "[[steps]]\npass = 'fx.dce'\n[[steps]]\npass = 'codegen.python'\n")
    pipeline = notebook("""
        from pathlib import Path
        pipeline = load({
            "pipeline": {"extends": Path("base.toml"), "disable": ("fx.dce",)},
            "settings": {"dump_dir": Path("dumps")},
            "override": {"decompose": {"keep": ("aten.gelu.default",)}},
        })
        """, registry)["pipeline"]
    assert pipeline.settings.dump_dir == "dumps"
    assert pipeline.step("decompose").options.keep == ["aten.gelu.default"]
    assert not pipeline.step("fx.dce").enabled


def test_explain_shows_the_python_line_where_a_file_shows_its_name(write, registry) -> None:
    names = notebook("""
        pipeline = load({
            "settings": {"verify": "facts"},
            "steps": [{"pass": "functionalize"}, {"pass": knob, "max_rewrites": 3}, {"pass": "codegen.python"}],
        })
        """, registry)
    explained = names["pipeline"].explain()
    assert explained["source"] == "nb.py:1" and explained["files"] == ["nb.py:1"]
    assert explained["steps"][1]["options"] == {"max_rewrites": {"value": 3, "from": "nb.py:1"}}
    assert str(explained) == "\n".join([
        "pipeline nb (nb.py:1)",
        "",
        "settings:",
        "key         value           set by",
        "----------  --------------  ---------",
        'verify      "facts"         nb.py:1',
        'dump        "off"           <default>',
        'dump_dir    "passkit-dump"  <default>',
        'on_error    "raise"         <default>',
        "repro_dir   none            <default>",
        'report      ""              <default>',
        "rtol        0.0001          <default>",
        "atol        1e-05           <default>",
        'cache       "on"            <default>',
        "cache_wait  600.0           <default>",
        "",
        "steps:",
        "#  step                tolerance  set by",
        "-  ------------------  ---------  -------",
        "1  functionalize       -          nb.py:1",
        "2  nb.knob             -          nb.py:1",
        "     max_rewrites = 3             nb.py:1",
        "3  codegen.python      -          nb.py:1",
    ])
    assert repr(explained) == str(explained)  # what a notebook cell ending in pipeline.explain() shows


def test_a_pass_objects_fingerprint_follows_its_code(write, registry) -> None:
    source = "pipeline = load({'steps': [{'pass': 'functionalize'}, {'pass': knob}, {'pass': 'codegen.python'}]})"
    first, again = notebook(source, registry)["pipeline"], notebook(source, registry)["pipeline"]
    assert first.fingerprint() == again.fingerprint()  # a fresh Pass object of the same code
    edited = notebook("""
        @graph_pass("nb.knob", requires={"functional"})
        def knob(program, *, max_rewrites: int = 100) -> bool:
            \"\"\"Turn a knob.\"\"\"
            return max_rewrites < 0
        """ + source, registry)["pipeline"]
    assert edited.fingerprint() != first.fingerprint()
    assert first.cache_refusal() is None


def test_a_pass_reading_what_cannot_be_hashed_is_refused_by_the_cache_not_the_loader(write, registry) -> None:
    names = notebook("""
        class Weights:
            pass

        weights = Weights()

        @graph_pass("nb.heavy", requires={"functional"})
        def heavy(program) -> bool:
            return weights is None

        pipeline = load({"steps": [{"pass": "functionalize"}, {"pass": heavy}, {"pass": "codegen.python"}]})
        """, registry)
    pipeline = names["pipeline"]
    assert pipeline.cache_refusal() == (
        "nb.py:10: steps[1] (nb.heavy): the global 'weights' is a Weights, which passkit cannot hash")
    assert pipeline.fingerprint() != pipeline.fingerprint()  # never the key of another compile
