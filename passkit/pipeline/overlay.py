"""Own how one pipeline file applies on top of what it extends, remembering who set what.

A file applies in this order: ``[pipeline]`` name and description, ``[settings]`` (key by key),
``[[steps]]`` (appended, or inserted with ``before``/``after``), ``[override.<id>]`` tables
(where a list option can be edited with ``key.add``/``key.remove``, see ``list_edits``), then
``disable``. Each value that a file sets records that file as its origin. Errors are one
line that starts with the file that holds the mistake.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic

from passkit.errors import PipelineError
from passkit.pipeline.messages import (
    DEFAULT_ORIGIN,
    CodeLocation,
    accepted_keys,
    did_you_mean,
    first_validation_error,
    toml_key,
)
from passkit.pipeline.list_edits import edit_list, is_list_edit, item_origin_key
from passkit.pipeline.model import Pipeline, Settings, Step
from passkit.pipeline.scalars import scalar_mismatch
from passkit.pipeline.schema import (
    FIXED_STEP_KEYS,
    OVERRIDE_KEYS,
    PIPELINE_KEYS,
    SETTINGS_KEYS,
    STEP_KEYS,
    TOP_LEVEL_TABLES,
    OverrideHeader,
    PipelineHeader,
    StepHeader,
)

if TYPE_CHECKING:
    from passkit.core.pass_api import Pass
    from passkit.core.registry import Registry

__all__ = ["Draft", "DraftStep", "check_top_level", "read_header", "apply_file", "finalize"]

HeaderT = TypeVar("HeaderT", bound=pydantic.BaseModel)
_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


@dataclass
class DraftStep:
    """A step while files still apply to it."""

    id: str
    pass_: Pass
    raw_options: dict[str, Any]
    options: pydantic.BaseModel
    when: str | None
    enabled: bool
    origin: dict[str, str]
    file: str
    index: int
    slot: str | None = None
    item_origin: dict[str, list[str]] = field(default_factory=dict)  # list option -> each item's file

    @property
    def location(self) -> str:
        # The id is what the user wrote and can override; the pass says what the step does.
        named = self.id if self.id == self.pass_.name else f"{self.id}: {self.pass_.name}"
        return f"{self.file}: steps[{self.index}] ({named})"


@dataclass
class Draft:
    """A pipeline while the files of its ``extends`` chain apply, base first."""

    name: str = ""
    description: str = ""
    kind: str = "compile"  # inherited through ``extends`` like the steps
    settings: dict[str, Any] = field(default_factory=dict)
    settings_origin: dict[str, str] = field(default_factory=dict)
    steps: list[DraftStep] = field(default_factory=list)
    files: list[Path | CodeLocation] = field(default_factory=list)

    def find(self, step_id: str) -> DraftStep | None:
        for step in self.steps:
            if step.id == step_id:
                return step
        return None

    def ids(self) -> list[str]:
        return [step.id for step in self.steps]


def _fail(message: str) -> PipelineError:
    return PipelineError(message)


def check_top_level(doc: dict[str, Any], file: str) -> None:
    """Reject unknown top-level tables and keys, and tables of the wrong shape."""
    for key, value in doc.items():
        if key in ("pipeline", "settings", "override"):
            if not isinstance(value, dict):
                raise _fail(f"{file}: {key}: expected a table; write [{key}]")
        elif key == "steps":
            if not isinstance(value, list):
                raise _fail(f"{file}: steps: expected an array of tables; write [[steps]]")
            for index, item in enumerate(value):
                if not isinstance(item, dict):
                    raise _fail(f"{file}: steps[{index}]: expected a table with a 'pass' key")
        elif key in PIPELINE_KEYS:
            raise _fail(f"{file}: {key}: put this key under [pipeline]")
        elif key in SETTINGS_KEYS:
            raise _fail(f"{file}: {key}: put this key under [settings]")
        elif isinstance(value, dict):
            raise _fail(f"{file}: unknown table [{key}]{did_you_mean(key, TOP_LEVEL_TABLES, template='[{}]')}")
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            raise _fail(f"{file}: unknown table [[{key}]]{did_you_mean(key, TOP_LEVEL_TABLES, template='[[{}]]')}")
        else:
            raise _fail(f"{file}: unknown top-level key {key!r}{did_you_mean(key, TOP_LEVEL_TABLES)}")


def _check_scalars(model: type[pydantic.BaseModel], values: dict[str, Any], where: str) -> None:
    """Refuse a value of another scalar kind than its field's, before pydantic could coerce it."""
    found = scalar_mismatch(model, values)
    if found is not None:
        raise _fail(f"{where}{found[0]}: {found[1]}")


def _unknown_key(where: str, key: str, known: list[str] | tuple[str, ...], what: str) -> PipelineError:
    hint = did_you_mean(key, known) or f"; {what} are {', '.join(known)}"
    return _fail(f"{where}.{key}: unknown key{hint}")


def read_header(doc: dict[str, Any], file: str) -> PipelineHeader:
    """Validate the ``[pipeline]`` table."""
    table = doc.get("pipeline", {})
    for key in table:
        if key not in PIPELINE_KEYS:
            raise _unknown_key(f"{file}: pipeline", key, PIPELINE_KEYS, "[pipeline] keys")
    _check_scalars(PipelineHeader, table, f"{file}: pipeline")
    try:
        return PipelineHeader.model_validate(table)
    except pydantic.ValidationError as exc:
        where, message = first_validation_error(exc)
        raise _fail(f"{file}: pipeline{where}: {message}") from None


def apply_file(
    draft: Draft, doc: dict[str, Any], header: PipelineHeader, path: Path | CodeLocation, file: str, registry: Registry
) -> None:
    """Apply one (already syntax-checked) file, or a dict's Python line, onto ``draft``, in place."""
    draft.files.append(path)
    draft.name = header.name or path.stem
    if header.description is not None:
        draft.description = header.description
    draft.kind = header.kind or draft.kind
    _apply_settings(draft, doc.get("settings", {}), file, registry.settings_model)
    _apply_steps(draft, doc.get("steps", []), file, registry)
    for step_id, table in doc.get("override", {}).items():
        _apply_override(draft, step_id, table, file, registry)
    for index, step_id in enumerate(header.disable):
        step = draft.find(step_id)
        if step is None:
            hint = did_you_mean(step_id, draft.ids())
            raise _fail(f"{file}: pipeline.disable[{index}]: no step with id {step_id!r}{hint}")
        step.enabled = False
        step.origin["enabled"] = file


def _apply_settings(draft: Draft, table: dict[str, Any], file: str, model: type[Settings]) -> None:
    known = tuple(model.model_fields)
    for key in table:
        if key not in known:
            raise _unknown_key(f"{file}: settings", key, known, "settings")
    _check_scalars(model, table, f"{file}: settings")
    merged = {**draft.settings, **table}
    try:
        model.model_validate(merged, strict=True)
    except pydantic.ValidationError as exc:
        where, message = first_validation_error(exc)
        raise _fail(f"{file}: settings{where}: {message}") from None
    draft.settings = merged
    draft.settings_origin.update({key: file for key in table})


def validate_options(
    pass_: Pass, values: dict[str, Any], where: str, other_keys: tuple[str, ...], registry: Registry
) -> pydantic.BaseModel:
    """Validate option values with the pass's own model; ``where`` prefixes each error.

    The registry is in the validation context, so options that name registered things
    (decomposition tables, pattern sets) are checked now, before any step runs.
    """
    accepted = accepted_keys(pass_.options_model)
    for key in values:
        if key not in accepted:
            hint = did_you_mean(key, [*accepted, *other_keys])
            if not hint:
                hint = f"; {pass_.name} takes {', '.join(accepted)}" if accepted else f"; {pass_.name} takes no options"
            raise _fail(f"{where}.{key}: unknown option{hint}")
    _check_scalars(pass_.options_model, values, where)
    try:
        return pass_.options(registry=registry, **values)
    except pydantic.ValidationError as exc:
        loc, message = first_validation_error(exc)
        raise _fail(f"{where}{loc}: {message}") from None


def _split_header(
    model: type[HeaderT], keys: tuple[str, ...], raw: dict[str, Any], where: str
) -> tuple[HeaderT, dict[str, Any]]:
    """Validate a table's envelope keys with ``model``; the other keys are the pass's options."""
    _check_scalars(model, {key: raw[key] for key in keys if key in raw}, where)
    try:
        header = model.model_validate({key: raw[key] for key in keys if key in raw})
    except pydantic.ValidationError as exc:
        loc, message = first_validation_error(exc)
        raise _fail(f"{where}{loc}: {message}") from None
    return header, {key: value for key, value in raw.items() if key not in keys}


def _apply_steps(draft: Draft, steps: list[dict[str, Any]], file: str, registry: Registry) -> None:
    last_after: dict[str, str] = {}  # anchor id -> id last inserted after it, to keep file order
    for index, raw in enumerate(steps):
        where = f"{file}: steps[{index}]"
        if "pass" not in raw:
            typos = difflib.get_close_matches("pass", list(raw), n=1)
            hint = f"; is {typos[0]!r} a typo?" if typos else ""
            raise _fail(f"{where}: missing key 'pass'{hint}")
        pass_name = raw["pass"]
        if not isinstance(pass_name, str):
            raise _fail(f"{where}.pass: Input should be a valid string")
        entry = registry.passes.get(pass_name)
        if entry is None:
            raise _fail(f"{where}: unknown pass {pass_name!r}{_unknown_pass_hint(pass_name, registry)}")
        label = f"{where} ({pass_name})"
        header, options = _split_header(StepHeader, STEP_KEYS, raw, label)
        step_id = header.id if header.id is not None else pass_name
        if not step_id or not set(step_id) <= _ID_CHARS:
            raise _fail(f"{label}.id: use letters, digits, '.', '_' and '-' only")
        # From here on the step is named as its location names it: by its id, then its pass.
        label = f"{where} ({pass_name})" if step_id == pass_name else f"{where} ({step_id}: {pass_name})"
        model = validate_options(entry.pass_, options, label, STEP_KEYS, registry)
        _check_unique(draft, step_id, label, pass_name)
        step = DraftStep(
            id=step_id,
            pass_=entry.pass_,
            raw_options=options,
            options=model,
            when=header.when,
            enabled=header.enabled,
            origin={
                "pass": file,
                "when": file if "when" in raw else DEFAULT_ORIGIN,
                "enabled": file if "enabled" in raw else DEFAULT_ORIGIN,
                **({"slot": file} if "slot" in raw else {}),
                **{key: file for key in options},
            },
            file=file,
            index=index,
            slot=header.slot,
        )
        _insert(draft, step, header, label, last_after)


def _unknown_pass_hint(pass_name: str, registry: Registry) -> str:
    hint = did_you_mean(pass_name, registry.passes)
    if not hint:
        hint = "; 'passkit passes' lists the registered passes"
    if registry.failed_plugins:
        hint += f" (plugins that failed to load: {', '.join(sorted(registry.failed_plugins))})"
    return hint


def _check_unique(draft: Draft, step_id: str, label: str, pass_name: str) -> None:
    other = draft.find(step_id)
    if other is None:
        return
    taken = set(draft.ids())
    number = 2
    while f"{step_id}.{number}" in taken:
        number += 1
    raise _fail(
        f"{label}: duplicate step id {step_id!r} (already used by {other.location}); "
        f'set a distinct id, e.g. id = "{step_id}.{number}"'
    )


def _insert(draft: Draft, step: DraftStep, header: StepHeader, label: str, last_after: dict[str, str]) -> None:
    if header.before is not None and header.after is not None:
        raise _fail(f"{label}: set either before or after, not both")
    anchor_key, anchor = ("before", header.before) if header.before is not None else ("after", header.after)
    if anchor is None:
        draft.steps.append(step)
        return
    target = draft.find(anchor)
    if target is None:
        raise _fail(f"{label}.{anchor_key}: no step with id {anchor!r}{did_you_mean(anchor, draft.ids())}")
    if anchor_key == "before":
        draft.steps.insert(draft.steps.index(target), step)
    else:
        previous = draft.find(last_after.get(anchor, anchor)) or target
        draft.steps.insert(draft.steps.index(previous) + 1, step)
        last_after[anchor] = step.id


def _dotted_id(prefix: str, table: Any, ids: list[str]) -> str | None:
    """The id that ``[override.fx.dce]`` (unquoted, so nested tables) was meant to name."""
    if not isinstance(table, dict):
        return None
    for key, value in table.items():
        candidate = f"{prefix}.{key}"
        if candidate in ids and isinstance(value, dict):
            return candidate
        found = _dotted_id(candidate, value, ids)
        if found:
            return found
    return None


def _apply_override(draft: Draft, step_id: str, table: Any, file: str, registry: Registry) -> None:
    where = f"{file}: override.{toml_key(step_id)}"
    step = draft.find(step_id)
    if step is None:
        dotted = _dotted_id(step_id, table, draft.ids())
        if dotted is not None:
            raise _fail(
                f"{where}: no step with id {step_id!r}; quote ids that contain dots: [override.{toml_key(dotted)}]"
            )
        raise _fail(f"{where}: no step with id {step_id!r}{did_you_mean(step_id, draft.ids())}")
    if not isinstance(table, dict):
        raise _fail(f"{where}: expected a table of option values")
    for key in FIXED_STEP_KEYS:
        if key in table:
            raise _fail(f"{where}.{key}: cannot be overridden; disable the step and add a new one")
    header, options = _split_header(OverrideHeader, OVERRIDE_KEYS, table, where)
    current = dict(step.options)
    for key, value in options.items():
        if is_list_edit(value, current.get(key)):
            origins = step.item_origin.get(key) or [step.origin.get(key, DEFAULT_ORIGIN)] * len(current[key])
            options[key], step.item_origin[key] = edit_list(current[key], origins, value, f"{where}.{key}", file)
        else:
            step.item_origin.pop(key, None)
    merged = {**step.raw_options, **options}
    step.options = validate_options(step.pass_, merged, where, OVERRIDE_KEYS, registry)
    step.raw_options = merged
    step.origin.update({key: file for key in options})
    if "when" in table:
        step.when = header.when
        step.origin["when"] = file
    if "enabled" in table:
        step.enabled = bool(header.enabled)
        step.origin["enabled"] = file
    if "slot" in table:
        step.slot = header.slot
        step.origin["slot"] = file


def finalize(draft: Draft, source: Path | CodeLocation | None, settings_model: type[Settings]) -> Pipeline:
    """Freeze a draft into a ``Pipeline``; values no file set get origin ``"<default>"``."""
    steps = []
    for position, draft_step in enumerate(draft.steps):
        origin = dict(draft_step.origin)
        for key in dict(draft_step.options):
            origin.setdefault(key, DEFAULT_ORIGIN)
        for key, items in draft_step.item_origin.items():
            origin.update({item_origin_key(key, index): item for index, item in enumerate(items)})
        steps.append(
            Step(
                position=position,
                id=draft_step.id,
                pass_=draft_step.pass_,
                options=draft_step.options,
                when=draft_step.when,  # type: ignore[arg-type]
                enabled=draft_step.enabled,
                origin=origin,
                location=draft_step.location,
                slot=draft_step.slot,
            )
        )
    return Pipeline(
        name=draft.name,
        description=draft.description,
        kind=draft.kind,  # type: ignore[arg-type]
        source=source,
        settings=settings_model.model_validate(draft.settings),
        settings_origin={key: draft.settings_origin.get(key, DEFAULT_ORIGIN) for key in settings_model.model_fields},
        steps=tuple(steps),
        files=tuple(draft.files),
    )
