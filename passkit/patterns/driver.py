"""Own the fixpoint driver: apply patterns to a graph, highest benefit first, until none applies.

Patterns are grouped by benefit. The highest tier runs first, to its own fixpoint: each round
walks the graph in order and, at every node, tries that tier's patterns whose first root is an
op of the node's target (in registration order); the first match that is not refused is
rewritten. A lower tier runs only when every higher tier is stable, and after it changes
anything the driver starts again from the top. So when two patterns compete for the same
nodes (``attention`` wants the views that ``noops`` would remove), the higher benefit wins in
a stated order, never by the order of nodes or steps.

Every application is counted per pattern, and so is every refusal by reason, so a pattern that
stopped matching (or is always refused) shows in the step's report instead of silently.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from torch.fx import GraphModule, Node

from passkit import _torch
from passkit.errors import PassError
from passkit.patterns.matcher import Match, match_pattern
from passkit.patterns.model import Alt, Op, Pattern, PatternSet
from passkit.patterns.replace import apply_replacement, refusal

__all__ = ["Applied", "PatternError", "apply_patterns", "expect_match", "find_matches"]


class PatternError(PassError):
    """A pattern rewrite went wrong: no match where one was expected, or no fixpoint."""


@dataclass
class Applied:
    """What the driver did: applications and refusals per pattern name."""

    counts: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)  # "pattern: reason" -> count
    # A replacement changed an output's strides: later nodes' meta["val"] must be re-derived.
    relayout: bool = False

    def merge(self, other: Applied) -> None:
        self.counts.update(other.counts)
        self.refused.update(other.refused)
        self.relayout |= other.relayout

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _flatten(patterns: Iterable[Pattern | PatternSet]) -> list[Pattern]:
    flat: list[Pattern] = []
    for item in patterns:
        flat.extend(item.patterns if isinstance(item, PatternSet) else [item])
    return flat


def _index(lowered: list[tuple[Pattern, tuple[Any, ...]]]) -> Callable[[Node], list[tuple[Pattern, tuple[Any, ...]]]]:
    by_target: dict[Any, list[tuple[Pattern, tuple[Any, ...]]]] = {}
    anywhere: list[tuple[Pattern, tuple[Any, ...]]] = []
    for entry in lowered:
        targets = root_targets(entry[1][0])
        for target in targets or ():
            by_target.setdefault(target, []).append(entry)
        if targets is None:
            anywhere.append(entry)

    def candidates(node: Node) -> list[tuple[Pattern, tuple[Any, ...]]]:
        target = node.target
        found = list(by_target.get(target, ()))
        packet = getattr(target, "overloadpacket", None) if isinstance(target, _torch.OpOverload) else None
        if packet is not None:
            found += by_target.get(packet, ())
        found += anywhere
        order = {id(p): i for i, (p, _) in enumerate(lowered)}
        # An Alt root indexed under two targets of one packet appears twice; keep it once.
        return sorted({id(e[0]): e for e in found}.values(), key=lambda e: order[id(e[0])])

    return candidates


def root_targets(root: Any) -> tuple[Any, ...] | None:
    """The ops a search root can start at (an ``Op``, or an ``Alt`` of ``Op``s); None: any node."""
    if isinstance(root, Op):
        return (root.target,)
    if isinstance(root, Alt) and root.options and all(isinstance(o, Op) for o in root.options):
        return tuple(dict.fromkeys(o.target for o in root.options))
    return None


def find_matches(gm: GraphModule, patterns: Iterable[Pattern | PatternSet], *, canonical: Any = None) -> list[Match]:
    """Every place a pattern matches in ``gm``, without rewriting (for tests and debugging)."""
    found = []
    lowered = [(p, p.roots(canonical)) for p in _flatten(patterns)]
    candidates = _index(lowered)
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        for pattern, roots in candidates(node):
            match = match_pattern(pattern, roots, node)
            if match is not None:
                found.append(match)
    return found


def apply_patterns(
    gm: GraphModule,
    patterns: Iterable[Pattern | PatternSet],
    *,
    canonical: Any = None,
    max_applications: int = 1000,
    should_apply: Callable[[Match], bool] | None = None,
) -> Applied:
    """Rewrite ``gm`` in place to a fixpoint of ``patterns``; returns what was applied.

    ``canonical`` is the target opset traced searches are lowered for. ``should_apply`` may veto
    single applications (bisecting a miscompile down to one rewrite).

    Raises:
        PatternError: more than ``max_applications`` rewrites, which means patterns undo each other.
    """
    flat = _flatten(patterns)
    tiers = sorted({p.benefit for p in flat}, reverse=True)
    by_tier = [_index([(p, p.roots(canonical)) for p in flat if p.benefit == b]) for b in tiers]
    applied = Applied()
    tier = 0
    while tier < len(by_tier):
        if _round(gm, by_tier[tier], applied, should_apply, max_applications):
            tier = 0  # repeat until stable; after a lower tier's change, higher ones may match anew
            continue
        tier += 1
    if applied.total:
        gm.graph.lint()
        gm.recompile()
    return applied


def _round(
    gm: GraphModule,
    candidates: Callable[[Node], list[tuple[Pattern, tuple[Any, ...]]]],
    applied: Applied,
    should_apply: Callable[[Match], bool] | None,
    max_applications: int,
) -> bool:
    """One walk over the graph; whether anything was rewritten."""
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or getattr(node, "_erased", False):
            continue
        if _apply_at(gm, node, candidates(node), applied, should_apply):
            changed = True
            if applied.total > max_applications:
                top = applied.counts.most_common(1)[0][0]
                raise PatternError(
                    f"patterns did not reach a fixpoint after {max_applications} rewrites "
                    f"(most applied: {top!r}); two patterns probably undo each other"
                )
    return changed


def _apply_at(
    gm: GraphModule,
    node: Node,
    entries: list[tuple[Pattern, tuple[Any, ...]]],
    applied: Applied,
    should_apply: Callable[[Match], bool] | None,
) -> bool:
    order: dict[Node, int] | None = None
    for pattern, roots in entries:
        match = match_pattern(pattern, roots, node)
        if match is None:
            continue
        if order is None:
            order = {n: i for i, n in enumerate(gm.graph.nodes)}
        reason = match.refused or refusal(match, order)
        if reason is None and should_apply is not None and not should_apply(match):
            reason = "vetoed"
        done = apply_replacement(gm, match) if reason is None else False
        if reason is None and not done:
            reason = "replacement does not fit"
        if reason is not None:
            applied.refused[f"{pattern.name}: {reason}"] += 1
            continue
        applied.counts[pattern.name] += 1
        applied.relayout |= done == "relayout"
        return True
    return False


def expect_match(
    applied: Applied, names: Iterable[str], *, where: str = "", explain: Callable[[str], str] | None = None
) -> None:
    """Raise a one-line ``PatternError`` if a named pattern (or set prefix) never matched.

    A match that a ``should_apply`` veto refused counts as matched: the pattern does match, and
    bisection vetoes applications to find a bad one. ``explain(name)`` may add why the patterns
    under ``name`` missed (``passkit.patterns.debug.nearest_misses``)."""
    for name in names:
        # Refusals are keyed "pattern: reason", so a name or set prefix starts them.
        if any(_under(key, name) for key in applied.counts) or any(
            _under(key, name) and key.endswith(": vetoed") for key in applied.refused
        ):
            continue
        refused = [k for k in applied.refused if _under(k, name)]
        why = f"; refused: {', '.join(refused)}" if refused else ""
        misses = explain(name) if explain is not None else ""
        prefix = f"{where}: " if where else ""
        raise PatternError(f"{prefix}pattern {name!r} matched nothing{why}{f'; {misses}' if misses else ''}")


def _under(key: str, name: str) -> bool:
    """Whether a count or refusal key belongs to pattern or set ``name``."""
    return key == name or key.startswith(f"{name}:")
