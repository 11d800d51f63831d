"""Own pattern debugging: say why a pattern does not match a graph.

``why_not(gm, pattern)`` tries the pattern at every node whose target is one of the pattern's
first root ops and reports, per candidate node, the deepest place the match failed (or that
the ``check`` rejected it). No candidate at all means the root op itself is missing, which
usually means the graph was canonicalized differently (lowered through another table, for
example).

``nearest_misses(patterns, graphs)`` is the one-line form a ``rewrite`` step with
``expect_match`` fails with: per pattern, the candidate node among all the step's graphs where
the match got deepest, its source line, and what stopped it there.
"""

from __future__ import annotations

from typing import Any, Iterable

from torch.fx import GraphModule, Node

from passkit.core.failed_node import source_line
from passkit.patterns.driver import root_targets
from passkit.patterns.matcher import MATCHED_STRUCTURE, deepest_miss, explain_miss, target_matches
from passkit.patterns.model import Pattern

__all__ = ["nearest_miss", "nearest_misses", "why_not"]


def _candidates(gm: GraphModule, targets: tuple[Any, ...] | None) -> Iterable[Node]:
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if targets is None or any(target_matches(t, node.target) for t in targets):
            yield node


def _missing_root(roots: tuple[Any, ...]) -> str:
    targets = root_targets(roots[0])
    wanted = " or ".join(str(t) for t in targets) if targets else repr(roots[0])
    return f"no node calls {wanted}, the pattern's root op"


def why_not(gm: GraphModule, pattern: Pattern, *, canonical: Any = None, limit: int = 5) -> list[str]:
    """One line per candidate anchor (at most ``limit``) saying why the pattern fails there."""
    roots = pattern.roots(canonical)
    lines = []
    for node in _candidates(gm, root_targets(roots[0])):
        lines.append(f"{pattern.name} at {node.name}: {explain_miss(pattern, roots, node)}")
        if len(lines) >= limit:
            break
    return lines or [f"{pattern.name}: {_missing_root(roots)}"]


def nearest_miss(pattern: Pattern, graphs: Iterable[tuple[str, GraphModule, Any]]) -> str:
    """Where ``pattern`` came nearest to matching in ``graphs`` (``(name, gm, canonical)``
    triples) and the first thing that failed there, in one line without the pattern's name."""
    graphs = list(graphs)
    best: tuple[int, str, Node, str] | None = None
    roots: tuple[Any, ...] = ()
    for graph_name, gm, canonical in graphs:
        roots = pattern.roots(canonical)
        for node in _candidates(gm, root_targets(roots[0])):
            depth, reason = deepest_miss(pattern, roots, node)
            if best is None or depth > best[0]:
                best = (depth, graph_name, node, reason)
    if best is None:
        return _missing_root(roots) if roots else "no graph to match"
    depth, graph_name, node, reason = best
    if depth > MATCHED_STRUCTURE:
        reason = "it matches here, and the step refused it"
    where = f" in graph {graph_name!r}" if len(graphs) > 1 else ""
    line = source_line(node)
    return f"nearest node {node.name}{where}{f' ({line})' if line else ''}: {reason}"


def nearest_misses(patterns: Iterable[Pattern], graphs: Iterable[tuple[str, GraphModule, Any]]) -> str:
    """``nearest_miss`` for each pattern, joined by "; "; patterns that miss alike share a clause
    (``attention:mul_masked_fill and 11 more: no node calls ...``)."""
    graphs = list(graphs)
    by_reason: dict[str, list[str]] = {}
    for pattern in patterns:
        by_reason.setdefault(nearest_miss(pattern, graphs), []).append(pattern.name)
    clauses = []
    for reason, names in by_reason.items():
        who = ", ".join(names) if len(names) <= 2 else f"{names[0]} and {len(names) - 1} more"
        clauses.append(f"{who}: {reason}")
    return "; ".join(clauses)
