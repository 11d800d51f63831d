"""Own how a resolved pipeline explains itself: its plan as JSON-able data and as the text
``passkit explain`` prints, each value with the file (or the Python line) that set it.

``Pipeline.explain()`` returns an ``Explanation``: the data (a dict, what ``passkit explain
--json`` writes) whose ``str()`` is the text, so a notebook cell that ends in
``pipeline.explain()`` shows the same table the command prints. The command and the pipeline
share this module, which sits below the CLI, so a ``Pipeline`` never imports the CLI.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import pydantic

from passkit.pipeline.exports import edge_dialects
from passkit.pipeline.messages import DEFAULT_ORIGIN, display_source

if TYPE_CHECKING:
    from passkit.pipeline.model import Pipeline, Step

__all__ = ["Explanation", "explain_data", "explain_text", "format_value", "options_json", "step_tolerance", "text_table"]

WIDE = 60  # longer list values are shown one item per row


def options_json(options: pydantic.BaseModel) -> dict[str, Any]:
    """Option values as JSON-able data (``repr`` for values pydantic cannot serialise)."""
    try:
        return options.model_dump(mode="json")
    except Exception:  # arbitrary option types (callables, tensors) have no JSON form
        return {key: _jsonable(value) for key, value in dict(options).items()}


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)



class Explanation(dict):  # type: ignore[type-arg]
    """The resolved plan as data (a dict, as before), shown as ``passkit explain``'s text.

    ``print(pipeline.explain())`` and a notebook cell ending in ``pipeline.explain()`` both show
    the table; indexing and ``json.dumps`` see the data.
    """

    def __init__(self, data: dict[str, Any], text: str) -> None:
        super().__init__(data)
        self.text = text

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython's display of the last value
        printer.text(self.text)


def step_tolerance(step: Step) -> dict[str, float] | None:
    """The ``(rtol, atol)`` the step's pass declares for its options, as ``{"rtol", "atol"}``; None
    when it keeps eager's numerics (the pipeline's own ``rtol``/``atol`` hold)."""
    declared = step.pass_.declared_tolerance(step.options)
    return None if declared is None else {"rtol": float(declared[0]), "atol": float(declared[1])}


def explain_data(pipeline: Pipeline) -> dict[str, Any]:
    """The resolved plan as JSON-able data, each value with the file that set it."""
    settings = pipeline.settings.model_dump(mode="json")
    return {
        "name": pipeline.name,
        "description": pipeline.description,
        "source": display_source(pipeline.source) if pipeline.source is not None else None,
        "files": [display_source(path) for path in pipeline.files],
        "kind": pipeline.kind,
        "can_train": pipeline.can_train,
        "settings": {key: {"value": settings[key], "from": pipeline.settings_origin[key]} for key in settings},
        "steps": [_explain_step(step) for step in pipeline.steps],
    }


def _explain_step(step: Step) -> dict[str, Any]:
    options = options_json(step.options)
    described = {}
    for key, value in options.items():
        described[key] = {"value": value, "from": step.origin.get(key, "")}
        if isinstance(value, list) and f"{key}[0]" in step.origin:  # edited with key.add / key.remove
            described[key]["items_from"] = [step.origin.get(f"{key}[{i}]", "") for i in range(len(value))]
    return {
        "number": step.position + 1,  # 1-based, as in run tables, progress lines and dump names
        "position": step.position,
        "id": step.id,
        "pass": step.pass_name,
        "when": step.when,
        "enabled": step.enabled,
        "from": {key: step.origin[key] for key in ("pass", "when", "enabled")},
        "options": described,
        "tolerance": step_tolerance(step),
        **({"slot": {"value": step.slot, "from": step.origin.get("slot", "")}} if step.slot is not None else {}),
    }


def explain_text(pipeline: Pipeline) -> str:
    """Render the plan: a header, the settings, then each step with its options."""
    lines = [f"pipeline {pipeline.name}" + (f" ({pipeline.source})" if pipeline.source else "")]
    if pipeline.description:
        lines.append(f"  {pipeline.description}")
    if len(pipeline.files) > 1:
        lines.append("files: " + " -> ".join(str(path) for path in pipeline.files))
    if pipeline.kind == "export":
        lines.append("kind: export (passkit.export hands the program back as an ExportedProgram)")
    if pipeline.kind == "edge":
        lines.append("kind: edge (passkit.to_executorch writes the program as an ExecuTorch .pte)")
        lines.extend(edge_dialects(pipeline))
    lines.append("")
    lines.append("settings:")
    settings = pipeline.settings.model_dump()
    lines.append(
        text_table(
            ("key", "value", "set by"),
            (
                (key, format_value(value), pipeline.settings_origin.get(key, DEFAULT_ORIGIN))
                for key, value in settings.items()
            ),
        )
    )
    lines.append("")
    lines.append("steps:")
    rows = []
    for step in pipeline.steps:
        flags = []
        if not step.enabled:
            flags.append(f"disabled by {step.origin.get('enabled', DEFAULT_ORIGIN)}")
        if step.when:
            flags.append(f"when = {step.when}")
        if step.slot is not None:
            # The set-by column names the step's file; the slot names its own only when another set it.
            slot_origin = step.origin.get("slot", DEFAULT_ORIGIN)
            same = slot_origin == step.origin.get("pass", DEFAULT_ORIGIN)
            flags.append(f"slot {step.slot}" if same else f"slot {step.slot}, set by {slot_origin}")
        title = f"{step.id} (pass {step.pass_name})" if step.id != step.pass_name else step.id
        if flags:
            title += f" [{', '.join(flags)}]"
        rows.append((str(step.position + 1), title, _tolerance(step), step.origin.get("pass", DEFAULT_ORIGIN)))
        for key, value in step.options.model_dump().items():
            items = [step.origin[f"{key}[{i}]"] for i in range(len(value))] if f"{key}[0]" in step.origin else None
            rows.extend(("", text, "", origin) for _, text, origin in _option_rows(key, value, step.origin.get(key, DEFAULT_ORIGIN), items))
    lines.append(text_table(("#", "step", "tolerance", "set by"), rows))
    return "\n".join(lines)


def _tolerance(step: Step) -> str:
    """The tolerance the step's pass declares, as ``passkit passes`` shows one; ``-`` for none."""
    declared = step_tolerance(step)
    return "-" if declared is None else f"rtol={declared['rtol']:g}, atol={declared['atol']:g}"


def _option_rows(key: str, value: object, origin: str, items: list[str] | None = None) -> list[tuple[str, str, str]]:
    """One row per option; a long list, or one that overlays edited (``items``: each item's
    file), gets one row per item so the table stays readable."""
    text = format_value(value)
    if not isinstance(value, list) or (len(text) <= WIDE and items is None):
        return [("", f"  {key} = {text}", origin)]
    rows = [("", f"  {key} = [", origin)]
    item_origins = items or [""] * len(value)
    rows.extend(("", f"    {format_value(item)},", by) for item, by in zip(value, item_origins))
    rows.append(("", "  ]", ""))
    return rows


def text_table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, items_overflow: bool = True) -> str:
    """Render rows under headers in fixed-width, left-aligned columns.

    With ``items_overflow``, a row whose last cell is empty (a list item under its option) may
    run past its column into the empty space, so one long item does not widen the whole table.
    Without it every row sizes the columns (a listing whose last cell may just be blank).
    """
    rows = [tuple(str(cell) for cell in row) for row in rows]
    sized = ([row for row in rows if row[-1]] if items_overflow else rows) or rows
    widths = [max([len(h)] + [len(row[i]) for row in sized]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(cells)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def format_value(value: Any) -> str:
    """Render an option or setting value as it would appear in a pipeline file."""
    if isinstance(value, (str, list, dict, bool, int, float)) or value is None:
        return json.dumps(value) if value is not None else "none"
    return str(value)
