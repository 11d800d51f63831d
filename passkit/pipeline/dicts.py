"""Own pipelines written in Python: a dict with a pipeline file's keys (``pipeline``,
``settings``, ``steps``, ``override``), attributed to the Python line that handed it over, whose
steps may name a ``Pass`` object instead of a registered pass.

A dict is a pipeline file in another spelling: once its shape is checked here (with Python's
words: a dict, a list, where a file's errors say table and array), the loader applies it with
the same models as a file, so every other error reads as a file's does, starting with the line
(``nb.py:12: steps[0] (nb.knob).max_rewrites: expected an integer, got a string ("x")``). That
line is the caller's frame outside passkit (and outside torch, whose Dynamo may be the one to
ask for a backend's pipeline) when the dict is loaded.

A ``Pass`` object needs no plugin: it joins the registry this load resolves against, unless a
registered pass has its name. Such steps are marked ``unregistered``, and their passes are
fingerprinted by value (``passkit.core.code_digest``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from passkit.core.pass_api import Pass
from passkit.errors import PipelineError
from passkit.pipeline.messages import CodeLocation, did_you_mean
from passkit.pipeline.schema import PIPELINE_KEYS, SETTINGS_KEYS, TOP_LEVEL_TABLES

if TYPE_CHECKING:
    from passkit.core.registry import Registry
    from passkit.pipeline.model import Pipeline

__all__ = ["caller_location", "python_document", "mark_unregistered"]

# Frames of these packages are never the user's line: passkit's own, and torch's (Dynamo calls a
# backend, which loads its pipeline, from inside the user's first call of the compiled model).
_NOT_THE_CALLER = ("passkit", "torch")


def caller_location() -> CodeLocation:
    """The first frame outside passkit and torch: the Python line a dict pipeline came from."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in _NOT_THE_CALLER:
        frame = frame.f_back
    return CodeLocation(Path(frame.f_code.co_filename), frame.f_lineno)


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a dict"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__}"
    if isinstance(value, Pass):
        return f"the Pass {value.name!r}"
    if callable(value) and hasattr(value, "__name__"):
        return f"the function {value.__name__!r}; make it a pass with @passkit.graph_pass"
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name} ({value!r})"


def _plain(value: Any) -> Any:
    """Lists for tuples and dicts for other mappings, as TOML gives them; paths as strings."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _check_shape(spec: Mapping[str, Any], file: str) -> None:
    """A file's table and array checks, in a dict's words."""
    for key, value in spec.items():
        if key in ("pipeline", "settings", "override"):
            if not isinstance(value, Mapping):
                raise PipelineError(f"{file}: {key}: expected a dict, got {_kind(value)}")
            for step_id, options in value.items() if key == "override" else ():
                if not isinstance(options, Mapping):
                    raise PipelineError(f"{file}: override.{step_id}: expected a dict of option values, got {_kind(options)}")
        elif key == "steps":
            if not isinstance(value, (list, tuple)):
                raise PipelineError(f"{file}: steps: expected a list of dicts, one per step, got {_kind(value)}")
            for index, item in enumerate(value):
                if not isinstance(item, Mapping):
                    raise PipelineError(f"{file}: steps[{index}]: expected a dict with a 'pass' key, got {_kind(item)}")
        elif key in PIPELINE_KEYS:
            raise PipelineError(f"{file}: {key}: put this key in the 'pipeline' dict")
        elif key in SETTINGS_KEYS:
            raise PipelineError(f"{file}: {key}: put this key in the 'settings' dict")
        else:
            raise PipelineError(f"{file}: unknown key {key!r}{did_you_mean(str(key), TOP_LEVEL_TABLES)}; "
                                f"a pipeline dict has {', '.join(TOP_LEVEL_TABLES)}")


def _registered_by(entry: Any) -> str:
    shipped = f"{entry.distribution} {entry.distribution_version}".strip()
    return f"plugin {entry.plugin!r}" + (f" ({shipped})" if shipped else "")


def python_document(spec: Mapping[str, Any], file: str, registry: Registry) -> tuple[dict[str, Any], Registry, dict[str, Pass]]:
    """The dict as a file's document (``Pass`` objects replaced by their names), the registry to
    load it against (with those passes in it), and the passes no plugin registered, by name.

    Raises:
        PipelineError: a shape no file could have, a step's ``pass`` that is neither a name nor a
            ``Pass``, or a ``Pass`` named like a registered pass or like another ``Pass`` of the dict.
    """
    _check_shape(spec, file)
    doc = {key: (_plain(value) if key != "steps" else value) for key, value in spec.items()}
    unregistered: dict[str, tuple[Pass, int]] = {}
    steps = []
    for index, raw in enumerate(spec.get("steps", [])):
        step = {key: (_plain(value) if key != "pass" else value) for key, value in raw.items()}
        given = step.get("pass")
        if isinstance(given, Pass):
            entry = registry.passes.get(given.name)
            where = f"{file}: steps[{index}] ({given.name})"
            if entry is not None and entry.pass_ is not given:
                raise PipelineError(
                    f"{where}: this Pass is not the registered pass {given.name!r} of {_registered_by(entry)}; "
                    f"give it a name of its own"
                )
            first = unregistered.get(given.name)
            if first is not None and first[0] is not given:
                raise PipelineError(
                    f"{where}: another Pass named {given.name!r} is the pass of steps[{first[1]}]; give each pass a name of its own"
                )
            if entry is None:
                unregistered.setdefault(given.name, (given, index))
            step["pass"] = given.name
        elif "pass" in step and not isinstance(given, str):
            raise PipelineError(f"{file}: steps[{index}].pass: expected a pass name or a Pass, got {_kind(given)}")
        steps.append(step)
    if "steps" in spec:
        doc["steps"] = steps
    passes = {name: pass_ for name, (pass_, _) in unregistered.items()}
    return doc, (registry.with_passes(passes) if passes else registry), passes


def mark_unregistered(pipeline: Pipeline, passes: dict[str, Pass]) -> Pipeline:
    """``pipeline`` with each step whose pass is one of ``passes`` marked ``unregistered``."""
    steps = tuple(
        dataclasses.replace(step, unregistered=True) if passes.get(step.pass_name) is step.pass_ else step
        for step in pipeline.steps
    )
    return dataclasses.replace(pipeline, steps=steps)
