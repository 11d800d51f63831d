"""Own the envelope of a pipeline file: which tables and keys exist, and their types.

The envelope is validated strictly (TOML values are typed, so nothing is coerced). A step's
keys other than the envelope keys are the pass's options; the pass's own model validates those.
"""

from __future__ import annotations

from typing import Literal

import pydantic

from passkit.pipeline.model import Settings

__all__ = [
    "TOP_LEVEL_TABLES",
    "PIPELINE_KEYS",
    "SETTINGS_KEYS",
    "STEP_KEYS",
    "OVERRIDE_KEYS",
    "FIXED_STEP_KEYS",
    "SLOT_NAMES",
    "PipelineHeader",
    "StepHeader",
    "OverrideHeader",
]


# Inductor's custom-pass slots a step can be mounted in, in the order torch runs them
# (``passkit.pipeline.slots`` owns what each one holds).
SLOT_NAMES = ("pre_grad", "joint_pre", "joint_post", "partition", "post_grad_pre", "post_grad_post")
SlotName = Literal["pre_grad", "joint_pre", "joint_post", "partition", "post_grad_pre", "post_grad_post"]


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, strict=True)


class PipelineHeader(_Strict):
    """The ``[pipeline]`` table."""

    name: str | None = None
    description: str | None = None
    # What the plan makes: compiled code ("compile"), or a program ``passkit.export`` hands
    # back as an ``ExportedProgram`` ("export": no joint, no partition, no codegen), or a program
    # ``passkit.to_executorch`` writes as a ``.pte`` ("edge": the same, lowered to ExecuTorch).
    kind: Literal["compile", "export", "edge"] | None = None
    extends: str | None = None
    disable: list[str] = []


class StepHeader(_Strict):
    """The keys of a ``[[steps]]`` entry that are not the pass's options."""

    pass_: str = pydantic.Field(alias="pass")
    id: str | None = None
    when: Literal["training", "inference"] | None = None
    enabled: bool = True
    slot: SlotName | None = None
    before: str | None = None
    after: str | None = None


class OverrideHeader(_Strict):
    """The keys of an ``[override.<id>]`` table that are not the pass's options."""

    when: Literal["training", "inference"] | None = None
    enabled: bool | None = None
    slot: SlotName | None = None


TOP_LEVEL_TABLES = ("pipeline", "settings", "steps", "override")
PIPELINE_KEYS = tuple(PipelineHeader.model_fields)
SETTINGS_KEYS = tuple(Settings.model_fields)
STEP_KEYS = ("pass", "id", "when", "enabled", "slot", "before", "after")
OVERRIDE_KEYS = tuple(OverrideHeader.model_fields)
# Keys an override may not change: they decide which step it is and where it stands.
FIXED_STEP_KEYS = ("pass", "id", "before", "after")
