"""Own the resolved pipeline: ``Settings``, ``Step`` and ``Pipeline``, with provenance.

These are what loading a pipeline file (or a dict with a file's keys) produces and what the
runner consumes. Every resolved value remembers the file that set it, or for a dict the Python
line that handed it over (``"<default>"`` when nothing did, ``"<argument>"`` when
``with_settings`` did), and ``Pipeline.explain()`` shows it. ``Pipeline.fingerprint()`` is what the
compile cache keys on; ``cache_refusal()`` says why a pipeline cannot be cached at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pydantic

from passkit.errors import PipelineError
from passkit.pipeline.explain import Explanation, explain_data, explain_text, options_json, step_tolerance
from passkit.pipeline.messages import (
    ARGUMENT_ORIGIN,
    CodeLocation,
    did_you_mean,
    display_source,
    first_validation_error,
)
from passkit.pipeline.scalars import scalar_mismatch

if TYPE_CHECKING:
    from passkit.core.pass_api import Pass

__all__ = ["Settings", "Step", "Pipeline", "options_json", "step_tolerance"]


class Settings(pydantic.BaseModel):
    """The ``[settings]`` table: how the runner runs the steps (not what they compute).

    Plugins add keys through ``passkit_register_settings``; the registry's ``settings_model``
    is this model extended with them.
    """

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    verify: Literal["off", "facts", "numerics"] = "off"
    dump: Literal["off", "changed", "all"] = "off"
    dump_dir: str = "passkit-dump"
    on_error: Literal["raise", "eager"] = "raise"
    # A failing step writes a reproducer here; "" writes none. Unset: $PASSKIT_REPRO_DIR, else a
    # folder under the system temp directory (passkit.artifacts.reproducer.repro_root).
    repro_dir: str | None = None
    report: str = ""  # an HTML report of the run is written to this file; "" writes none
    # What ``verify = "numerics"`` and ``passkit run`` accept as equal to eager (``allclose``);
    # a pass may declare a looser tolerance of its own (``graph_pass(..., tolerance=...)``).
    rtol: float = pydantic.Field(default=1e-4, ge=0)
    atol: float = pydantic.Field(default=1e-5, ge=0)
    # The on-disk compile cache (``passkit.cache.store``); "off" neither reads nor writes entries.
    cache: Literal["on", "off"] = "on"
    # Seconds a compile waits for another process compiling the same key (its lease) before
    # compiling itself; 0 never waits (``passkit.cache.store``).
    cache_wait: float = pydantic.Field(default=600.0, ge=0)


@dataclass(frozen=True)
class Step:
    """One use of a pass in the resolved plan."""

    position: int  # 0-based index in the resolved plan
    id: str  # defaults to the pass name
    pass_: Pass  # resolved from the registry the file was loaded with
    options: pydantic.BaseModel  # the pass's own validated options model instance
    when: Literal["training", "inference"] | None
    enabled: bool
    origin: dict[str, str]  # "pass", "when", "enabled", each option -> file that set it
    # Where the step was written, for messages: "x.toml: steps[1] (partition.default)".
    location: str = ""
    # The Inductor custom-pass slot a mounted file runs the step in (``passkit.frontends.inductor_slots``).
    slot: str | None = None
    # The pass came as a ``Pass`` object in a dict, registered by no plugin: no installed file or
    # distribution version stands for its code, so it is fingerprinted by value.
    unregistered: bool = False

    @property
    def pass_name(self) -> str:
        return self.pass_.name


@dataclass(frozen=True)
class Pipeline:
    """A validated, resolved pipeline: settings and ordered steps, with provenance."""

    name: str
    description: str
    source: Path | CodeLocation | None  # a file, or the Python line that handed over a dict
    settings: Settings
    settings_origin: dict[str, str]
    steps: tuple[Step, ...]
    files: tuple[Path | CodeLocation, ...] = ()  # the extends chain, base first
    kind: Literal["compile", "export", "edge"] = "compile"  # [pipeline] kind: what the plan makes

    @property
    def can_train(self) -> bool:
        """Whether an enabled step produces the ``joint`` fact, so a training program can run."""
        return any(step.enabled and "joint" in step.pass_.produces for step in self.steps)

    @property
    def mounted(self) -> bool:
        """Whether the file mounts its steps in Inductor's custom-pass slots (a step sets ``slot``)."""
        return any(step.slot is not None for step in self.steps)

    @property
    def label(self) -> str:
        """What messages about the whole pipeline start with: its file, else its name."""
        return display_source(self.source) if self.source is not None else self.name

    def where(self, step: Step) -> str:
        """``<file>: steps[i] (<id>)``, naming the file and index where the step was written."""
        return step.location or f"{self.label}: steps[{step.position}] ({step.id})"

    def step(self, step_id: str) -> Step:
        """The step with id ``step_id``; KeyError if none has it."""
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)

    def with_settings(self, **overrides: Any) -> Pipeline:
        """A copy with some settings replaced (validated; origin ``"<argument>"``).

        ``None`` values are ignored, so callers can pass optional arguments straight through.
        """
        given = {key: value for key, value in overrides.items() if value is not None}
        if not given:
            return self
        model = type(self.settings)
        known = list(model.model_fields)
        for key in given:
            if key not in known:
                hint = did_you_mean(key, known) or f"; settings are {', '.join(known)}"
                raise PipelineError(f"passkit: unknown setting {key!r}{hint}")
        if isinstance(given.get("dump_dir"), Path):
            given["dump_dir"] = str(given["dump_dir"])
        mismatch = scalar_mismatch(model, given, render=repr)
        if mismatch is not None:
            raise PipelineError(f"passkit: settings{mismatch[0]}: {mismatch[1]}")
        try:
            settings = model.model_validate({**self.settings.model_dump(), **given}, strict=True)
        except pydantic.ValidationError as exc:
            where, message = first_validation_error(exc)
            raise PipelineError(f"passkit: settings{where}: {message}") from None
        origin = {**self.settings_origin, **{key: ARGUMENT_ORIGIN for key in given}}
        return dataclasses.replace(self, settings=settings, settings_origin=origin)

    def explain(self) -> Explanation:
        """The resolved plan, each value with the file (or Python line) that set it: a dict of
        JSON-able data (what ``passkit explain --json`` writes) whose ``str()`` is the text
        ``passkit explain`` prints, so a notebook shows the table."""
        return Explanation(explain_data(self), explain_text(self))

    def fingerprint(self) -> str:
        """Hash of what the plan computes: each step's pass, options, ``when``, ``enabled`` and
        the pass's own fingerprint. Settings are left out: they change how steps are observed
        (dumps, verification), not the compiled result.

        A pass given as an object in a dict is fingerprinted by value (its code and the values it
        reads); one whose values cannot be hashed gets a fresh token each time, so no cache entry
        or Inductor cache key is ever shared with another compile (``cache_refusal`` says why).
        """
        plan = []
        for step in self.steps:
            options = options_json(step.options)
            fingerprint = step.pass_.fingerprint(by_value=step.unregistered)
            entry = [step.id, step.pass_name, step.when, step.enabled, options, fingerprint]
            plan.append(entry + [step.slot] if step.slot is not None else entry)
        text = json.dumps(plan, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()

    def cache_refusal(self) -> str | None:
        """Why programs compiled with this pipeline cannot be cached, or None when they can: an
        unregistered pass that reads a value passkit cannot hash, named with the step."""
        for step in self.steps:
            problem = step.pass_.by_value_problem() if step.unregistered else None
            if problem is not None:
                return f"{self.where(step)}: {problem}"
        return None
