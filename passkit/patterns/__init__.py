"""Own the pattern-rewrite API for pass and plugin authors (``passkit.patterns``).

Write a pattern by tracing torch code (``from_trace``) or by spelling out ``Op``/``Var`` trees;
give it a replacement (a traced function or a graph builder) and a benefit; group patterns in a
``PatternSet`` and register it with ``passkit_register_patterns``; the ``rewrite`` pass applies
the sets a pipeline names. See docs/patterns.md.
"""

from __future__ import annotations

from passkit.patterns.constants import constant_value, is_constant
from passkit.patterns.driver import Applied, PatternError, apply_patterns, expect_match, find_matches
from passkit.patterns.matcher import Match, match_pattern
from passkit.patterns.model import ANY, Alt, Dim, Op, Pattern, PatternSet, Var, Where, Wildcard, fingerprint_of
from passkit.patterns.replace import GraphBuilder
from passkit.patterns.trace import TracedSearch, from_trace

__all__ = [
    "ANY",
    "Alt",
    "Applied",
    "Dim",
    "GraphBuilder",
    "Match",
    "Op",
    "Pattern",
    "PatternError",
    "PatternSet",
    "TracedSearch",
    "Var",
    "Where",
    "Wildcard",
    "apply_patterns",
    "constant_value",
    "expect_match",
    "find_matches",
    "fingerprint_of",
    "from_trace",
    "is_constant",
    "match_pattern",
]
