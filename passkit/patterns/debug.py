"""Own pattern debugging: say why a pattern does not match a graph.

``why_not(gm, pattern)`` tries the pattern at every node whose target is the pattern's first
root op and reports, per candidate node, the deepest place the match failed (or that the
``check`` rejected it). No candidate at all means the root op itself is missing, which usually
means the graph was canonicalized differently (lowered through another table, for example).
"""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule

from passkit.patterns.matcher import explain_miss, target_matches
from passkit.patterns.model import Op, Pattern

__all__ = ["why_not"]


def why_not(gm: GraphModule, pattern: Pattern, *, canonical: Any = None, limit: int = 5) -> list[str]:
    """One line per candidate anchor (at most ``limit``) saying why the pattern fails there."""
    roots = pattern.roots(canonical)
    root = roots[0]
    targets = [root.target] if isinstance(root, Op) else []
    lines = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if targets and not any(target_matches(t, node.target) for t in targets):
            continue
        lines.append(f"{pattern.name} at {node.name}: {explain_miss(pattern, roots, node)}")
        if len(lines) >= limit:
            break
    if not lines:
        wanted = targets[0] if targets else repr(root)
        lines.append(f"{pattern.name}: no node calls {wanted}, the pattern's root op")
    return lines
