"""Own what a pipeline run records: one ``StepRecord`` per step, gathered in a ``Report``.

The runner fills a record for every step, skipped ones included, so a report always has one row
per step of the plan. ``Report.table()`` is what ``passkit run`` prints; ``Report.to_json()`` is
plain data for scripts. A run that was compared with eager (``passkit run``,
``passkit.frontends.check.run_check``) attaches its ``Verdict``: ok or mismatch (or fell back, or a step
failed), the max |diff| of every output, gradient and buffer, the tolerance, and the exit code;
the table ends with it. Records hold no torch objects, so reports outlive the program they
describe and serialise as they are.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["StepRecord", "Report", "Verdict", "ValueDiff", "format_bytes", "format_stats", "format_row", "summary_line", "TABLE_HEADERS"]

TABLE_HEADERS = ("#", "step", "pass", "changed", "time", "nodes", "notes")


@dataclass
class StepRecord:
    """What one step did: whether it ran, whether it changed the graphs, its cost and figures."""

    position: int
    id: str
    pass_name: str
    status: Literal["ran", "skipped"] = "ran"
    reason: str = ""
    changed: bool = False
    claimed_changed: bool | None = None
    seconds: float = 0.0
    nodes_before: int = 0
    nodes_after: int = 0
    dumps: list[str] = field(default_factory=list)
    repro: str = ""  # the reproducer folder a failing step wrote (passkit.instruments.repro)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def changed_label(self) -> str:
        if self.status == "skipped":
            return "skipped"
        return "yes" if self.changed else "no"

    def remarks(self) -> str:
        """The row's free-text column: skip reason, the pass's figures, disagreements, dumps."""
        if self.status == "skipped":
            return self.reason
        parts = []
        stats = format_stats(self.stats)
        if stats:
            parts.append(stats)
        # A pass whose claim disagrees with the hashes usually has a bug in its bookkeeping.
        if self.claimed_changed is True and not self.changed:
            parts.append("claimed a change")
        elif self.claimed_changed is False and self.changed:
            parts.append("claimed no change")
        if self.dumps:
            parts.append(f"dumps={len(self.dumps)}")
        return ", ".join(parts)


@dataclass(frozen=True)
class ValueDiff:
    """One compared value (``output[0]``, ``grad[fc.weight]``): its max |diff| and whether it agrees."""

    label: str
    max_diff: float
    ok: bool = True


@dataclass
class Verdict:
    """How the run compared with eager, as ``passkit run`` concludes it."""

    outcome: Literal["ok", "mismatch", "fell back to eager", "step failed"]
    exit_code: int
    rtol: float | None = None
    atol: float | None = None
    values: list[ValueDiff] = field(default_factory=list)
    detail: str = ""  # the first mismatch, or why the compile fell back or the step failed

    @property
    def tolerance(self) -> str:
        """``rtol 0.001, atol 0.0001`` (empty when nothing was compared)."""
        return "" if self.rtol is None or self.atol is None else f"rtol {self.rtol:g}, atol {self.atol:g}"

    def headline(self) -> str:
        """``verdict: MISMATCH vs eager (rtol 0.001, atol 0.0001), exit code 1``."""
        outcome = self.outcome if self.outcome == "ok" else self.outcome.upper()
        versus = " vs eager" if self.outcome in ("ok", "mismatch") else ""
        within = f" ({self.tolerance})" if self.tolerance else ""
        return f"verdict: {outcome}{versus}{within}, exit code {self.exit_code}"

    def lines(self) -> list[str]:
        """The headline, one row per compared value (max |diff|, flagged when it disagrees), the detail."""
        body = [self.headline()]
        width = max((len(v.label) for v in self.values), default=0)
        for value in self.values:
            flag = "" if value.ok else "  MISMATCH"
            body.append(f"  {value.label.ljust(width)}  max |diff| {format_diff(value.max_diff)}{flag}")
        if self.detail:
            body.append(f"  {self.detail}")
        return body

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome, "exit_code": self.exit_code, "rtol": self.rtol, "atol": self.atol,
            "values": [{"label": v.label, "max_diff": _plain(v.max_diff), "ok": v.ok} for v in self.values],
            "detail": self.detail,
        }


def format_diff(value: float) -> str:
    """A max |diff| as verdicts show it: ``3.1e-04``."""
    return f"{float(value):.1e}"


@dataclass
class Report:
    """Every step's record for one program run through one pipeline."""

    pipeline: str
    records: list[StepRecord]
    seconds: float = 0.0
    graph: str = ""
    # The compile cache's answer: "hit" (loaded, no step ran), "miss" (looked up and not found:
    # the steps ran), "" (not looked up: cache off, verify or dump on, or a pipeline it refuses).
    cache: str = ""
    verdict: Verdict | None = None  # the comparison with eager, when the run was compared
    load_seconds: float = 0.0  # a hit: the time this process took to load it (no step ran)
    # Why the program skipped the compile cache, when a step's pass cannot be fingerprinted (a
    # notebook's pass reading a tensor): the step and the value, one line under the table.
    uncached: str = ""

    @property
    def changed_steps(self) -> list[str]:
        return [r.id for r in self.records if r.status == "ran" and r.changed]

    def table(self) -> str:
        """Render a fixed-width table with one row per step and a summary line."""
        headers = TABLE_HEADERS
        # A hit ran no step: its time column would only repeat the compiling process's figures.
        rows = [format_row(record) for record in self.records]
        if self.cache == "hit":
            rows = [(*row[:4], "-", *row[5:]) for row in rows]
        widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(headers)]
        right_aligned = {0, 4}

        def line(cells: tuple[str, ...]) -> str:
            out = []
            for i, cell in enumerate(cells):
                out.append(cell.rjust(widths[i]) if i in right_aligned else cell.ljust(widths[i]))
            return "  ".join(out).rstrip()

        labels = [label for label in (self.graph, "cache hit: no step ran" if self.cache == "hit" else "") if label]
        title = f"pipeline {self.pipeline}" + (f" ({', '.join(labels)})" if labels else "")
        body = [title, line(headers), line(tuple("-" * w for w in widths))]
        body.extend(line(row) for row in rows)
        body.append(summary_line(self))
        if self.uncached:
            body.append(f"not cached: {self.uncached}")
        if self.verdict is not None:
            body.extend(self.verdict.lines())
        return "\n".join(body)

    def to_json(self) -> dict[str, Any]:
        """Return plain JSON data: pipeline, graph, seconds and one object per step."""
        steps = []
        for record in self.records:
            data = asdict(record)
            data["number"] = record.position + 1  # 1-based, as in the table and dump names
            data["stats"] = {str(k): _plain(v) for k, v in record.stats.items()}
            steps.append(data)
        verdict = None if self.verdict is None else self.verdict.to_json()
        return {"pipeline": self.pipeline, "graph": self.graph, "seconds": self.seconds, "cache": self.cache,
                "load_seconds": self.load_seconds, "uncached": self.uncached, "steps": steps, "verdict": verdict}


def summary_line(report: Report) -> str:
    """The line under the table: how many steps ran and changed the graphs, and the total time
    (a hit: its load time, then the compiling process's figures)."""
    ran = sum(1 for r in report.records if r.status == "ran")
    if report.cache == "hit":
        return (f"loaded from the compile cache in {_ms(report.load_seconds)}, no step ran (the process that "
                f"compiled it ran {ran} of {len(report.records)} steps in {_ms(report.seconds)})")
    return f"{ran} of {len(report.records)} steps ran, {len(report.changed_steps)} changed the graphs, {_ms(report.seconds)} in total"


def format_row(record: StepRecord) -> tuple[str, ...]:
    """The table's cells for one step: number (1-based), id, pass, changed, time, nodes, notes."""
    ran = record.status == "ran"
    return (
        str(record.position + 1),
        record.id,
        record.pass_name,
        record.changed_label,
        _ms(record.seconds) if ran else "-",
        f"{record.nodes_before}\u2192{record.nodes_after}" if ran else "-",
        record.remarks(),
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def format_bytes(count: float) -> str:
    """Render a byte count the way the table does: ``512 B``, ``12.0 KiB``, ``3.5 MiB``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_stats(stats: dict[str, Any]) -> str:
    """Render a step's figures as ``key=value`` pairs.

    A ``<key>_bytes`` figure renders as a size: next to ``<key>`` when both are present
    (``saved=3 (12.0 KiB)``), else on its own (``workspace=1.5 MiB``).
    """
    parts = []
    for key, value in stats.items():
        if key.endswith("_bytes"):
            base = key[: -len("_bytes")]
            if base in stats:
                continue
            parts.append(f"{base}={format_bytes(value)}")
            continue
        text = f"{key}={_format_value(value)}"
        size = stats.get(f"{key}_bytes")
        if isinstance(size, (int, float)):
            text += f" ({format_bytes(size)})"
        parts.append(text)
    return ", ".join(parts)


def _format_value(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value) and value != int(value):
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_format_value(v) for v in value) + "]"
    return str(value)


def _plain(value: Any) -> Any:
    """Turn a stat into JSON data; anything exotic becomes its string form."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)
