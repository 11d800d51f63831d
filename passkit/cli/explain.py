"""Own ``passkit explain``: the resolved plan of a pipeline, with the file that set each value
and the tolerance each step declares."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from passkit.cli import terminal
from passkit.cli.plugin_option import plugin_option, register_plugins
from passkit.pipeline.messages import DEFAULT_ORIGIN
from passkit.pipeline.model import step_tolerance

if TYPE_CHECKING:
    from passkit.pipeline import Pipeline
    from passkit.pipeline.model import Step

__all__ = ["command", "explain_text"]

WIDE = 60  # longer list values are shown one item per row


@click.command("explain")
@click.argument("file")
@plugin_option
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def command(file: str, plugins: tuple[str, ...], as_json: bool) -> None:
    """Show FILE's resolved plan: settings and steps, each value with the file that set it."""
    from passkit.pipeline import load_pipeline
    from passkit.core.registry import get_registry

    register_plugins(plugins)
    pipeline = load_pipeline(file, registry=get_registry())
    if as_json:
        terminal.write_json(pipeline.explain())
        return
    terminal.out(explain_text(pipeline))


def explain_text(pipeline: Pipeline) -> str:
    """Render the plan: a header, the settings, then each step with its options."""
    lines = [f"pipeline {pipeline.name}" + (f" ({pipeline.source})" if pipeline.source else "")]
    if pipeline.description:
        lines.append(f"  {pipeline.description}")
    if len(pipeline.files) > 1:
        lines.append("files: " + " -> ".join(str(path) for path in pipeline.files))
    lines.append("")
    lines.append("settings:")
    settings = pipeline.settings.model_dump()
    lines.append(
        terminal.table(
            ("key", "value", "set by"),
            (
                (key, terminal.format_value(value), pipeline.settings_origin.get(key, DEFAULT_ORIGIN))
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
    lines.append(terminal.table(("#", "step", "tolerance", "set by"), rows))
    return "\n".join(lines)


def _tolerance(step: Step) -> str:
    """The tolerance the step's pass declares, as ``passkit passes`` shows one; ``-`` for none."""
    declared = step_tolerance(step)
    return "-" if declared is None else f"rtol={declared['rtol']:g}, atol={declared['atol']:g}"


def _option_rows(key: str, value: object, origin: str, items: list[str] | None = None) -> list[tuple[str, str, str]]:
    """One row per option; a long list, or one that overlays edited (``items``: each item's
    file), gets one row per item so the table stays readable."""
    text = terminal.format_value(value)
    if not isinstance(value, list) or (len(text) <= WIDE and items is None):
        return [("", f"  {key} = {text}", origin)]
    rows = [("", f"  {key} = [", origin)]
    item_origins = items or [""] * len(value)
    rows.extend(("", f"    {terminal.format_value(item)},", by) for item, by in zip(value, item_origins))
    rows.append(("", "  ]", ""))
    return rows
