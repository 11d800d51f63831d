"""No coercion between boolean, integer, number and string: in ``[settings]``, in step keys and in
pass options, whether the options model comes from keyword-only parameters or is a plugin's own
(lax) pydantic model. The refusal is one line naming the key, the kind expected and the value
given; an integer still fills a number."""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic
import pytest

from passkit.errors import PipelineError
from passkit.core.hookspecs import hookimpl
from passkit.core.pass_api import graph_pass
from passkit.pipeline.loader import load_pipeline
from passkit.pipeline.scalars import scalar_mismatch
from passkit.core.plugins import make_plugin_manager
from passkit.core.registry import build_registry

BASE = "[pipeline]\nextends = 'base.toml'\n"
CODEGEN = "[[steps]]\npass = 'codegen.python'\n"


@graph_pass("acme.count")
def _count(program, *, max_rewrites: int = 100, scale: float = 1.0, label: str | None = None) -> bool:
    """Counts."""
    return False


class _Plugin:
    @hookimpl
    def passkit_register_passes(self) -> list:
        return [_count]


@pytest.fixture
def registry_with_count(registry):
    pm = make_plugin_manager(builtins=False, load_entry_points=False)
    pm.register_plugin(_Plugin(), "acme", distribution=("acme-passes", "1.0"))
    own = build_registry(pm)
    registry.passes.update(own.passes)
    return registry


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[settings]\nverify = true\n", "x.toml: settings.verify: expected a string, got a boolean (true)"),
        ("[settings]\nrtol = '1e-3'\n", 'x.toml: settings.rtol: expected a number, got a string ("1e-3")'),
        ("[settings]\natol = false\n", "x.toml: settings.atol: expected a number, got a boolean (false)"),
        ("[settings]\nrepro_dir = 0\n", "x.toml: settings.repro_dir: expected a string, got an integer (0)"),
        ("description = 3\n", "x.toml: pipeline.description: expected a string, got an integer (3)"),
        (
            "[override.'partition.torch_min_cut']\nmemory_budget = '0.5'\n",
            'x.toml: override."partition.torch_min_cut".memory_budget: expected a number, got a string ("0.5")',
        ),
        (
            "[override.'partition.torch_min_cut']\nmemory_budget = true\n",
            'x.toml: override."partition.torch_min_cut".memory_budget: expected a number, got a boolean (true)',
        ),
        ("[override.'fx.dce']\nenabled = 1\n", 'x.toml: override."fx.dce".enabled: expected a boolean, got an integer (1)'),
    ],
    ids=["bool-for-literal", "string-for-float", "bool-for-float", "int-for-optional-string", "int-for-header-string",
         "string-for-float-option-of-an-explicit-model", "bool-for-float-option-of-an-explicit-model", "int-for-bool-step-key"],
)
def test_a_value_of_another_kind_is_a_one_line_error(write, registry, text, expected) -> None:
    write("base.toml", "[[steps]]\npass = 'partition.torch_min_cut'\n[[steps]]\npass = 'fx.dce'\n" + CODEGEN)
    write("x.toml", BASE + text)
    with pytest.raises(PipelineError) as info:
        load_pipeline("x.toml", registry=registry)
    assert str(info.value) == expected


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("max_rewrites = true", "expected an integer, got a boolean (true)"),
        ("max_rewrites = '5'", 'expected an integer, got a string ("5")'),
        ("max_rewrites = 5.0", "expected an integer, got a number (5.0)"),
        ("label = 3", "expected a string, got an integer (3)"),
    ],
)
def test_options_from_keyword_only_parameters_say_what_they_expected(write, registry_with_count, option, expected) -> None:
    write("x.toml", f"[[steps]]\npass = 'acme.count'\n{option}\n" + CODEGEN)
    with pytest.raises(PipelineError) as info:
        load_pipeline("x.toml", registry=registry_with_count)
    assert str(info.value) == f"x.toml: steps[0] (acme.count).{option.split()[0]}: {expected}"


def test_an_integer_fills_a_number(write, registry, registry_with_count) -> None:
    write("base.toml", "[[steps]]\npass = 'partition.torch_min_cut'\nmemory_budget = 1\n[[steps]]\npass = 'acme.count'\nscale = 2\n" + CODEGEN)
    write("x.toml", BASE + "[settings]\nrtol = 1\natol = 0\n")
    pipeline = load_pipeline("x.toml", registry=registry_with_count)
    assert (pipeline.settings.rtol, pipeline.settings.atol) == (1.0, 0.0)
    assert isinstance(pipeline.settings.rtol, float)
    assert pipeline.steps[0].options.memory_budget == 1.0
    assert pipeline.steps[1].options.scale == 2.0


def test_with_settings_names_the_python_value(write, registry) -> None:
    write("x.toml", CODEGEN)
    pipeline = load_pipeline("x.toml", registry=registry)
    with pytest.raises(PipelineError) as info:
        pipeline.with_settings(verify=True)
    assert str(info.value) == "passkit: settings.verify: expected a string, got a boolean (True)"
    assert pipeline.with_settings(rtol=1).settings.rtol == 1.0


class _Shapes(pydantic.BaseModel):
    pair: tuple[int, str] = (0, "")
    names: tuple[str, ...] = ()
    flag: bool | str = False
    level: Annotated[int, pydantic.Field(ge=0)] = 0
    mode: Literal["a", 1] = "a"
    anything: object = None


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"pair": [1, 2]}, (".pair[1]", "expected a string, got an integer (2)")),
        ({"names": ["a", True]}, (".names[1]", "expected a string, got a boolean (true)")),
        ({"flag": 1}, (".flag", "expected a boolean or a string, got an integer (1)")),
        ({"level": "3"}, (".level", 'expected an integer, got a string ("3")')),
        ({"mode": 1.5}, (".mode", "expected an integer or a string, got a number (1.5)")),
        ({"pair": [1, "x"], "names": ["a"], "flag": "yes", "level": 2, "mode": 1, "anything": True}, None),
    ],
    ids=["fixed-tuple", "variadic-tuple", "union", "annotated", "literal", "all-fit"],
)
def test_scalar_mismatch_reads_the_annotation(values, expected) -> None:
    assert scalar_mismatch(_Shapes, values) == expected
