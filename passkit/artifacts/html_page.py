"""Own the HTML run report: one self-contained page (inline CSS and SVG, no scripts, no fetches).

For each program of the run it shows the step timeline, a table of the steps (time, change, node
counts per graph, the step's figures such as saved bytes or pattern hits, the error of a failing
step), a picture of the forward/backward split (which values the forward saves for the backward,
and which the backward recomputes from them) and each graph's code after each step that changed
it, as a diff against the step before with the full code beside it. A run compared with eager
(``passkit run``) opens with its verdict: ok or mismatch, the tolerance, the exit code and the
max |diff| of each output and gradient. The data (``ProgramHistory``, one per program, of ``StepEntry`` rows) is recorded by
``passkit.instruments.html_report``.
"""

from __future__ import annotations

import difflib
import html
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from passkit.core.report import format_bytes, format_stats

if TYPE_CHECKING:
    from passkit.core.program import Program
    from passkit.core.report import Verdict

__all__ = ["render", "split_of", "split_svg", "StepEntry", "ProgramHistory", "ALL_GRAPHS"]

ALL_GRAPHS = "all graphs"  # the node-count column of a section loaded from the cache


@dataclass
class StepEntry:
    """One step as the report shows it; ``codes`` holds only the graphs whose code changed."""

    number: int
    id: str
    pass_name: str
    seconds: float = 0.0
    changed: bool = False
    nodes: dict[str, int] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    codes: dict[str, str] = field(default_factory=dict)
    error: str = ""
    cached: bool = False  # a row of the compiling run, shown for a compile the cache answered


@dataclass
class ProgramHistory:
    """Every step one program went through, from its capture on."""

    label: str
    pipeline: str
    training: bool
    steps: list[StepEntry] = field(default_factory=list)
    split: dict[str, Any] | None = None  # what passkit.artifacts.html_page.split_of found after partitioning
    cache: str = ""  # "hit": loaded from the compile cache, no step ran

MAX_ROWS = 200  # rows of the split picture; the rest is counted

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2430; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ccd; padding-bottom: 4px; }
h3 { font-size: 15px; margin-top: 20px; }
table { border-collapse: collapse; } td, th { padding: 2px 10px; border-bottom: 1px solid #e3e6ee; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.failed td { background: #fde2e1; } .changed { color: #0a6b2d; font-weight: 600; } .cached { color: #7a4d00; }
pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font: 12px/1.35 ui-monospace, monospace; }
.verdict { padding: 6px 12px; border-radius: 6px; } .verdict.ok { background: #dcfce4; } .verdict.bad { background: #fde2e1; }
.add { background: #dcfce4; display: block; } .del { background: #fde2e1; display: block; } .hunk { color: #6a737d; display: block; }
details { margin: 4px 0; } summary { cursor: pointer; }
svg text { font: 12px ui-monospace, monospace; }
"""


def _count(n: int, word: str) -> str:
    """``1 node``, ``3 nodes``: a count with its noun in the right number."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _e(text: Any) -> str:
    return html.escape(str(text))


def split_of(program: Program) -> dict[str, Any]:
    """The forward/backward split: saved values (name, shape, bytes) and backward nodes that
    recompute forward values from them (they do not depend on any tangent)."""
    forward, backward = program.graphs["forward"], program.graphs["backward"]
    output = next(n for n in reversed(forward.graph.nodes) if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    saved: dict[int, dict[str, Any]] = {}
    for desc, value in zip(program.io("forward").outputs, results):
        if desc.kind == "saved":
            saved[desc.index] = _value_info(getattr(value, "name", str(value)), getattr(value, "meta", {}).get("val"))
    placeholders = [n for n in backward.graph.nodes if n.op == "placeholder"]
    saved_by_node = {}
    tangent_driven = set()
    for node, desc in zip(placeholders, program.io("backward").inputs):
        if desc.kind == "saved" and desc.index in saved:
            saved_by_node[node] = saved[desc.index]["name"]
        elif desc.kind == "tangent":
            tangent_driven.add(node)
    recomputed = []
    for node in backward.graph.nodes:
        if node.op == "placeholder" or node.op == "output":
            continue
        if any(arg in tangent_driven for arg in node.all_input_nodes):
            tangent_driven.add(node)
            continue
        uses = [saved_by_node[arg] for arg in node.all_input_nodes if arg in saved_by_node]
        recomputed.append({"name": node.name, "op": str(node.target), "from": uses})
    values = [saved[i] for i in sorted(saved)]
    return {
        "forward_nodes": len(forward.graph.nodes),
        "backward_nodes": len(backward.graph.nodes),
        "saved": values,
        "saved_bytes": sum(v["bytes"] for v in values),
        "recomputed": recomputed,
    }


def _value_info(name: str, value: Any) -> dict[str, Any]:
    shape = list(getattr(value, "shape", []))
    dtype = str(getattr(value, "dtype", "")).removeprefix("torch.")
    try:
        size = int(value.numel() * value.element_size())
    except Exception:  # noqa: BLE001 - symbolic or non-tensor values have no byte count
        size = 0
    return {"name": name, "shape": [int(d) for d in shape] if all(isinstance(d, int) for d in shape) else [str(d) for d in shape], "dtype": dtype, "bytes": size}


def split_svg(split: dict[str, Any]) -> str:
    """Inline SVG: forward box, saved values, backward box, recomputed nodes, and what feeds what."""
    saved, recomputed = split["saved"][:MAX_ROWS], split["recomputed"][:MAX_ROWS]
    row, top = 20, 40
    height = top + row * max(len(saved), len(recomputed) + 3, 3) + 40
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="1180" height="{height}" role="img" aria-label="forward/backward split">']
    box_height = height - top - 20
    parts.append(f'<rect x="10" y="{top}" width="150" height="{box_height}" rx="6" fill="#dbe8ff" stroke="#4a6fb5"/>')
    parts.append(f'<text x="20" y="{top + 20}">forward</text><text x="20" y="{top + 38}">{_count(split["forward_nodes"], "node")}</text>')
    parts.append(f'<rect x="760" y="{top}" width="200" height="{row * 3}" rx="6" fill="#ffe7cc" stroke="#b5762a"/>')
    parts.append(f'<text x="770" y="{top + 20}">backward</text><text x="770" y="{top + 38}">{_count(split["backward_nodes"], "node")}</text>')
    parts.append(f'<text x="250" y="24">saved for the backward: {_count(len(split["saved"]), "value")}, {_e(format_bytes(split["saved_bytes"]))}</text>')
    positions = {}
    for i, value in enumerate(saved):
        y = top + row * i + 14
        positions[value["name"]] = y
        label = f'{value["name"]}  {value["dtype"]}{value["shape"]}  {format_bytes(value["bytes"])}'
        parts.append(f'<line x1="160" y1="{y - 4}" x2="245" y2="{y - 4}" stroke="#4a6fb5"/>')
        parts.append(f'<text x="250" y="{y}">{_e(label)}</text>')
        parts.append(f'<line x1="560" y1="{y - 4}" x2="760" y2="{top + 30}" stroke="#b5762a" stroke-opacity="0.35"/>')
    if recomputed:
        parts.append(f'<text x="760" y="{top + row * 3 + 16}" fill="#b5762a">computed in the backward from saved values only:</text>')
    for i, node in enumerate(recomputed):
        y = top + row * (i + 4) + 14
        parts.append(f'<text x="770" y="{y}" fill="#8a4b00">{_e(node["name"])} = {_e(node["op"])}</text>')
        for source in node["from"]:
            if source in positions:
                parts.append(f'<line x1="560" y1="{positions[source] - 4}" x2="765" y2="{y - 4}" stroke="#d9480f"/>')
    more = len(split["saved"]) - len(saved), len(split["recomputed"]) - len(recomputed)
    if any(more):
        parts.append(f'<text x="250" y="{height - 10}">... and {more[0]} more saved, {more[1]} more recomputed</text>')
    parts.append("</svg>")
    return "".join(parts)


def _timeline(steps: list[Any]) -> str:
    ran = [s for s in steps if s.number > 0]
    total = sum(s.seconds for s in ran) or 1.0
    row, width = 22, 560
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="980" height="{row * len(ran) + 10}" role="img" aria-label="step timeline">']
    start = 0.0
    for i, step in enumerate(ran):
        x, w, y = 260 + width * start / total, max(width * step.seconds / total, 1.5), i * row + 4
        color = "#d1242f" if step.error else ("#2f7d4f" if step.changed else "#9aa4b2")
        parts.append(f'<text x="4" y="{y + 14}">{step.number:>2} {_e(step.id)}</text>')
        parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 6}" fill="{color}"/>')
        parts.append(f'<text x="{min(x + w + 4, 900):.1f}" y="{y + 14}">{step.seconds * 1000:.1f} ms</text>')
        start += step.seconds
    parts.append("</svg>")
    return "".join(parts)


def _table(steps: list[Any]) -> str:
    graphs: list[str] = []
    for step in steps:
        graphs.extend(name for name in step.nodes if name not in graphs)
    head = "".join(f"<th>{_e(g)} nodes</th>" for g in graphs)
    rows = [f"<tr><th>#</th><th>step</th><th>pass</th><th>changed</th><th>time</th>{head}<th>figures</th></tr>"]
    for step in steps:
        counts = "".join(f'<td class="num">{step.nodes.get(g, "")}</td>' for g in graphs)
        changed = '<span class="changed">yes</span>' if step.changed else ("" if step.number == 0 else "no")
        time = "" if step.number == 0 else f"{step.seconds * 1000:.1f} ms"
        figures = _e(step.error or format_stats(step.stats))
        if step.cached:
            figures = f'<span class="cached">loaded from the compile cache</span> {figures}'.rstrip()
        css = ' class="failed"' if step.error else ""
        rows.append(
            f'<tr{css}><td class="num">{step.number}</td><td>{_e(step.id)}</td><td>{_e(step.pass_name)}</td>'
            f'<td>{changed}</td><td class="num">{time}</td>{counts}<td>{figures}</td></tr>'
        )
    return "<table>" + "".join(rows) + "</table>"


def _diff(before: str | None, after: str) -> str:
    if before is None:
        return '<span class="hunk">new graph</span>' + "".join(f'<span class="add">{_e(line)}</span>' for line in after.splitlines())
    lines = []
    for line in list(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=2))[2:]:
        css = "hunk" if line.startswith("@@") else "add" if line.startswith("+") else "del" if line.startswith("-") else ""
        lines.append(f'<span class="{css}">{_e(line)}</span>' if css else _e(line) + "\n")
    return "".join(lines)


def _code(steps: list[Any]) -> str:
    last: dict[str, str] = {}
    parts = []
    for step in steps:
        for graph, code in step.codes.items():
            title = "captured" if step.number == 0 else f"step {step.number} ({step.id})"
            body = code if step.number == 0 else None
            parts.append(f"<details><summary>{_e(title)}: graph <b>{_e(graph)}</b></summary>")
            if body is None:
                parts.append(f"<pre>{_diff(last.get(graph), code)}</pre><details><summary>full code</summary><pre>{_e(code)}</pre></details>")
            else:
                parts.append(f"<pre>{_e(body)}</pre>")
            parts.append("</details>")
            last[graph] = code
    return "".join(parts)


def _cache_note(history: ProgramHistory) -> str:
    if history.cache != "hit":
        return ""
    return ('<p class="cached">Loaded from the compile cache: no step ran in this process. Each row is the '
            "step as the run that compiled the program recorded it (its time, change and figures); node counts "
            "are totals over the graphs.</p>")


def verdict_html(verdict: Verdict) -> str:
    """The run's verdict: outcome, tolerance and exit code, then a row per compared value."""
    from passkit.core.report import format_diff

    css = "ok" if verdict.outcome == "ok" else "bad"
    failed = ' class="failed"'
    rows = "".join(
        f'<tr{"" if value.ok else failed}><td>{_e(value.label)}</td><td class="num">{format_diff(value.max_diff)}</td>'
        f'<td>{"ok" if value.ok else "MISMATCH"}</td></tr>'
        for value in verdict.values
    )
    table = f"<table><tr><th>value</th><th>max |diff|</th><th></th></tr>{rows}</table>" if rows else ""
    detail = f"<p>{_e(verdict.detail)}</p>" if verdict.detail else ""
    return f'<h2>Verdict</h2><p class="verdict {css}"><b>{_e(verdict.headline())}</b></p>{detail}{table}'


def render(histories: list[ProgramHistory], verdict: Verdict | None = None) -> str:
    """The whole page for every program of the run, under the run's verdict when it has one."""
    sections = [verdict_html(verdict)] if verdict is not None else []
    for history in histories:
        split = history.split
        split_html = (
            f"<p>{_count(len(split['saved']), 'value')} saved ({_e(format_bytes(split['saved_bytes']))}); "
            f"{_count(len(split['recomputed']), 'node')} of the backward {'is' if len(split['recomputed']) == 1 else 'are'} "
            f"computed from saved values only (recomputation).</p>{split_svg(split)}"
            if split is not None
            else "<p>No forward/backward split: the program was not partitioned.</p>"
        )
        sections.append(
            f"<section><h2>{_e(history.label)}: pipeline {_e(history.pipeline)}</h2>{_cache_note(history)}"
            f"<h3>Step timeline</h3>{_timeline(history.steps)}"
            f"<h3>Steps</h3>{_table(history.steps)}"
            f"<h3>Forward/backward split</h3>{split_html}"
            f"<h3>Graph code after each step (diff against the step before)</h3>{_code(history.steps)}</section>"
        )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>passkit run report</title>'
        f"<style>{_STYLE}</style></head><body><h1>passkit run report</h1>{''.join(sections)}</body></html>\n"
    )
