"""Own ``passkit passes``: every registered pass with its plugin, contract, declared tolerance,
options and summary."""

from __future__ import annotations

import typing
from typing import TYPE_CHECKING, Any

import click

from passkit.cli import terminal

if TYPE_CHECKING:
    from passkit.core.registry import PassEntry

__all__ = ["command", "pass_json"]


@click.command("passes")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of text.")
def command(as_json: bool) -> None:
    """List every registered pass: plugin, contract, tolerance, options and what it does."""
    from passkit.core.registry import get_registry

    # Plugins that failed to load were already reported on stderr when the manager was built.
    registry = get_registry()
    entries = [registry.passes[name] for name in sorted(registry.passes)]
    if as_json:
        terminal.write_json([pass_json(entry) for entry in entries])
        return
    for index, entry in enumerate(entries):
        if index:
            terminal.out()
        terminal.out(_pass_text(entry))


def pass_json(entry: PassEntry) -> dict[str, Any]:
    """Describe one registered pass as JSON data."""
    pass_ = entry.pass_
    return {
        "name": pass_.name,
        "plugin": entry.plugin,
        "distribution": entry.distribution,
        "summary": pass_.summary,
        "requires": sorted(pass_.requires),
        "produces": sorted(pass_.produces),
        "invalidates": sorted(pass_.invalidates),
        "training_only": pass_.training_only,
        "version": pass_.version,
        "tolerance": _tolerance_json(pass_.tolerance),
        "options": _options(entry),
        "fingerprint": pass_.fingerprint(),
    }


def _options(entry: PassEntry) -> list[dict[str, Any]]:
    fields = entry.pass_.options_model.model_fields
    return [
        {"name": o["name"], "type": _type_name(fields[o["name"]].annotation, o["type"]),
         "default": o["default"], "required": o["required"]}
        for o in entry.pass_.option_fields()
    ]


def _type_name(annotation: Any, fallback: str) -> str:
    """``list[str]`` rather than ``list``: generic options need their element type shown."""
    if typing.get_args(annotation):
        return str(annotation).replace("typing.", "")
    return fallback


def _provider(entry: PassEntry) -> str:
    if not entry.distribution:
        return f"plugin {entry.plugin}"
    version = entry.distribution_version
    return f"plugin {entry.plugin}, {entry.distribution}" + (f" {version}" if version else "")


def _facts(names: frozenset[str]) -> str:
    return ", ".join(sorted(names)) or "-"


def _pass_text(entry: PassEntry) -> str:
    pass_ = entry.pass_
    lines = [f"{pass_.name}  ({_provider(entry)})"]
    if pass_.summary:
        lines.append(f"  {pass_.summary}")
    contract = (
        f"  requires: {_facts(pass_.requires)}; produces: {_facts(pass_.produces)}; "
        f"invalidates: {_facts(pass_.invalidates)}"
    )
    if pass_.training_only:
        contract += "; training only"
    lines.append(contract)
    if callable(pass_.tolerance):  # declared per step, from its options
        lines.append(f"  tolerance: {_PER_OPTIONS}{_first_line(pass_.tolerance.__doc__)}")
    elif pass_.tolerance is not None:  # undeclared: the pipeline's rtol/atol, nothing to show
        rtol, atol = pass_.tolerance
        lines.append(f"  tolerance: rtol={rtol:g}, atol={atol:g}")
    options = _options(entry)
    if not options:
        lines.append("  options: none")
    for option in options:
        default = "required" if option["required"] else f"= {terminal.format_value(option['default'])}"
        lines.append(f"  option {option['name']}: {option['type']} {default}")
    return "\n".join(lines)


_PER_OPTIONS = "per options"


def _tolerance_json(tolerance: Any) -> Any:
    if callable(tolerance):
        return _PER_OPTIONS
    return None if tolerance is None else dict(zip(("rtol", "atol"), tolerance))


def _first_line(doc: str | None) -> str:
    lines = (doc or "").strip().splitlines()
    return f" ({lines[0].rstrip('.')})" if lines else ""
