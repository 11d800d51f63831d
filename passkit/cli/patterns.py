"""Own ``passkit patterns``: the pattern sets that plugins register, by name, with the tolerance
each declares (what a ``rewrite`` step applying it lets numerics checks accept)."""

from __future__ import annotations

import click

from passkit.cli import terminal

__all__ = ["command"]


@click.command("patterns")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def command(as_json: bool) -> None:
    """List the registered pattern sets: name, patterns, options (``set_options.<name>`` on a
    ``rewrite`` step, with their defaults), declared tolerance, plugin and description."""
    from passkit.passes.rewrite import resolve_pattern_set
    from passkit.core.registry import get_registry

    registry = get_registry()
    rows = []
    for name in sorted(registry.patterns):
        try:
            resolved = resolve_pattern_set(name, registry)
            patterns = [{"name": p.name, "benefit": p.benefit, "fingerprint": p.fingerprint()} for p in resolved.patterns]
            description = resolved.description
            options = resolved.options().model_dump() if resolved.options is not None else {}
            tolerance = None if resolved.tolerance is None else dict(zip(("rtol", "atol"), resolved.tolerance))
        except Exception as exc:  # a broken set should not hide the others; show why it is broken
            patterns, options, tolerance, description = [], {}, None, f"invalid: {type(exc).__name__}: {exc}"
        rows.append(
            {
                "name": name,
                "patterns": patterns,
                "options": options,
                "tolerance": tolerance,
                "plugin": registry.providers.get(f"pattern set:{name}", ""),
                "description": description,
            }
        )
    if as_json:
        terminal.write_json(rows)
        return
    if not rows:
        terminal.out("no pattern sets registered")
        return
    terminal.out(
        terminal.table(
            ("name", "patterns", "options", "tolerance", "plugin", "description"),
            (
                (
                    r["name"], str(len(r["patterns"])), _options(r["options"]), _tolerance(r["tolerance"]),
                    r["plugin"], r["description"],
                )
                for r in rows
            ),
            items_overflow=False,  # a set without a description is a row of its own, not an item
        )
    )


def _options(options: dict) -> str:
    return ", ".join(f"{key} = {value}" for key, value in options.items())


def _tolerance(tolerance: dict | None) -> str:
    """As ``passkit passes`` shows a pass's; empty for a set that keeps eager's numerics."""
    return "" if tolerance is None else f"rtol={tolerance['rtol']:g}, atol={tolerance['atol']:g}"
