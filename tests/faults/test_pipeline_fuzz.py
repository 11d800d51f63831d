"""Property-based fuzzing of pipeline files: every input loads or raises a one-line PipelineError.

Two generators: well-formed TOML built from the real vocabulary (tables, keys, pass names,
option names and values of every TOML type, plus near-misses), and arbitrary bytes. Nothing
but a ``Pipeline`` or a ``PipelineError`` whose message is one line may come out. Bounded by
example counts so the module runs in well under a minute.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from passkit.errors import PipelineError
from passkit.pipeline import Pipeline, load_pipeline
from passkit.core.registry import get_registry

PASSES = ["functionalize", "decompose", "joint", "partition.default", "fx.dce", "fx.cse", "codegen.python", "nope"]
KEYS = [
    "pass", "id", "when", "enabled", "before", "after", "tables", "keep", "extra", "fast_calls",
    "memory_budget", "verify", "dump", "on_error", "rtol", "atol", "cache", "name", "extends", "x",
]
WORDS = [
    "training", "inference", "core_aten", "aten.gelu.default", "raise", "eager", "off", "facts",
    "numerics", "on", "training-python", "decompose", "fx.dce", "", "../x", "a\nb",
]

scalars = st.one_of(
    st.sampled_from(WORDS), st.text(max_size=8), st.booleans(), st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True), st.none(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS + ["add", "remove"]), inner, max_size=3)),
    max_leaves=6,
)
steps = st.lists(
    st.dictionaries(st.sampled_from(KEYS), values, max_size=4).flatmap(
        lambda d: st.sampled_from(PASSES).map(lambda p: {"pass": p, **d} if "pass" not in d else d)
    ),
    max_size=5,
)
documents = st.fixed_dictionaries(
    {},
    optional={
        "pipeline": st.dictionaries(st.sampled_from(["name", "description", "extends", "disable", "x"]), values, max_size=3),
        "settings": st.dictionaries(st.sampled_from(KEYS), values, max_size=3),
        "steps": steps,
        "override": st.dictionaries(st.sampled_from(PASSES), st.dictionaries(st.sampled_from(KEYS), values, max_size=3), max_size=2),
        "stray": values,
    },
)


def _toml_value(value: Any) -> str:
    if value is None:
        return '"none"'  # TOML has no null; a string stands in
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


def _toml(document: dict[str, Any]) -> str:
    lines = []
    for key in ("stray",):
        if key in document:
            lines.append(f"stray = {_toml_value(document[key])}")
    for table in ("pipeline", "settings"):
        if table in document:
            lines.append(f"[{table}]")
            lines.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in document[table].items())
    for step in document.get("steps", []):
        lines.append("[[steps]]")
        lines.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in step.items())
    for step_id, table in document.get("override", {}).items():
        lines.append(f"[override.{json.dumps(step_id)}]")
        lines.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


def _load(data: bytes) -> bool:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.toml"
        path.write_bytes(data)
        try:
            pipeline = load_pipeline(path, registry=get_registry())
        except PipelineError as exc:
            message = str(exc)
            assert message and "\n" not in message, repr(message)
            return False
        assert isinstance(pipeline, Pipeline)
        return True


FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


@FUZZ
@given(documents)
@example({"steps": [{"pass": "functionalize"}, {"pass": "codegen.python"}], "settings": {"rtol": 1e-3}})
def test_structured_pipeline_files_load_or_fail_in_one_line(document: dict[str, Any]) -> None:
    _load(_toml(document).encode())


def test_the_generator_writes_files_that_load() -> None:
    """The property is not vacuous: the renderer produces loadable files."""
    document = {"steps": [{"pass": "functionalize"}, {"pass": "codegen.python", "fast_calls": False}],
                "settings": {"rtol": 1e-3, "cache": "off"}}
    assert _load(_toml(document).encode())


@FUZZ
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_arbitrary_bytes_load_or_fail_in_one_line(data: bytes) -> None:
    _load(data)
