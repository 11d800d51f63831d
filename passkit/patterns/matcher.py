"""Own matching: does a pattern match at a node, and with which bindings?

Matching is structural and backtracks over ``Alt`` options and commutative argument orders.
Node arguments are read by schema position (defaults filled in), so a pattern does not care
whether tracing wrote an argument positionally, by keyword, or left a default out.

A value-preserving copy (``aten.clone``, ``aten.alias``) is looked through when the pattern
asks for another op there: whether tracing inserts a copy depends on the strides it saw, and
a copy never changes values. Looked-through nodes belong to the match like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node

from passkit import _torch
from passkit.patterns.model import Alt, Dim, Op, Pattern, Var, Where, Wildcard
from passkit.patterns.where import where_miss

__all__ = ["Match", "deepest_miss", "explain_miss", "match_pattern", "node_args", "target_matches"]

_MISSING = object()
_LOOK_THROUGH = frozenset({torch.ops.aten.clone.default, torch.ops.aten.alias.default})
VIEW_OPS = frozenset(
    {
        torch.ops.aten.view.default,
        torch.ops.aten._unsafe_view.default,
        torch.ops.aten.reshape.default,
        torch.ops.aten.expand.default,
    }
)


def _is_identity(node: Node) -> bool:
    """A copy, or a view/expand to the input's own shape: the same values as its input."""
    if node.target in _LOOK_THROUGH:
        return bool(node.args)
    if node.target in VIEW_OPS and node.args and isinstance(node.args[0], Node):
        out, inp = node.meta.get("val"), node.args[0].meta.get("val")
        return isinstance(out, torch.Tensor) and isinstance(inp, torch.Tensor) and out.shape == inp.shape
    return False


def _optional(pattern: Op) -> bool:
    """A traced view that kept every size: tracing elsewhere may leave it out."""
    return pattern.target in VIEW_OPS and pattern.trailing is not None and pattern.where is not None and (
        pattern.where.rank == pattern.trailing
    )


@dataclass
class Match:
    """One place a pattern matched: its root nodes, every matched node, and the bindings."""

    pattern: Pattern
    roots: tuple[Node, ...]
    nodes: list[Node]
    bindings: dict[str, Any]
    # Why the pattern's ``check`` refuses it (a string it returned), counted in ``refused``.
    refused: str | None = None

    def val(self, name: str) -> Any:
        """The ``meta["val"]`` of a bound node (a fake tensor), or the bound literal itself."""
        value = self.bindings[name]
        return value.meta.get("val") if isinstance(value, Node) else value


@dataclass
class _State:
    bindings: dict[str, Any] = field(default_factory=dict)
    nodes: dict[Node, int] = field(default_factory=dict)  # matched node -> id of its pattern element
    sizes: dict[str, Any] = field(default_factory=dict)
    elements: dict[int, Node] = field(default_factory=dict)  # pattern element -> the node it matched

    def fork(self) -> _State:
        return _State(dict(self.bindings), dict(self.nodes), dict(self.sizes), dict(self.elements))

    def adopt(self, other: _State) -> None:
        self.bindings, self.nodes, self.sizes, self.elements = other.bindings, other.nodes, other.sizes, other.elements


# Same values, different aliasing: which one tracing writes depends on the input's strides.
_RESHAPES = frozenset({torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default})


def target_matches(wanted: Any, target: Any) -> bool:
    """An overload matches itself; an overload packet matches each of its overloads; the
    reshaping ops ``view``, ``_unsafe_view`` and ``reshape`` match each other."""
    if wanted is target or (wanted in _RESHAPES and target in _RESHAPES):
        return True
    if isinstance(wanted, _torch.OpOverloadPacket) and isinstance(target, _torch.OpOverload):
        return target.overloadpacket is wanted
    return False


def node_args(node: Node) -> list[Any]:
    """The node's arguments in schema order, with omitted defaults filled in."""
    target = node.target
    if not isinstance(target, _torch.OpOverload):
        return list(node.args)
    values = []
    for index, argument in enumerate(target._schema.arguments):
        if index < len(node.args):
            values.append(node.args[index])
        elif argument.name in node.kwargs:
            values.append(node.kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            values.append(_MISSING)
    return values


def _kwarg_index(target: Any, name: str) -> int | None:
    if isinstance(target, _torch.OpOverload):
        for index, argument in enumerate(target._schema.arguments):
            if argument.name == name:
                return index
    return None


def _where_holds(where: Where, value: Any, state: _State) -> bool:
    return where_miss(where, value, state.sizes) is None


def _first_tensor_rank(values: list[Any]) -> int | None:
    for value in values:
        val = value.meta.get("val") if isinstance(value, Node) else None
        if isinstance(val, torch.Tensor):
            return val.dim()
    return None


def _match(pattern: Any, value: Any, state: _State, rank: int | None = None) -> bool:
    if isinstance(pattern, Wildcard):
        return True
    if isinstance(pattern, Var):
        if pattern.where is not None and not _where_holds(pattern.where, value, state):
            return False
        if pattern.name in state.bindings:
            return _same(state.bindings[pattern.name], value)
        state.bindings[pattern.name] = value
        return True
    if isinstance(pattern, Alt):
        for option in pattern.options:
            trial = state.fork()
            if _match(option, value, trial, rank):
                state.adopt(trial)
                return True
        return False
    if isinstance(pattern, Op):
        return _match_op(pattern, value, state)
    if isinstance(pattern, Dim):
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        if pattern.rank is not None:
            return rank is not None and _from_end(value, rank) == _from_end(pattern.value, pattern.rank)
        return value == pattern.value or (rank is not None and rank > 0 and value % rank == pattern.value % rank)
    if isinstance(pattern, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(pattern):
            return False
        return all(_match(p, v, state, rank) for p, v in zip(pattern, value))
    if isinstance(value, Node):
        return False
    return type(value) is type(pattern) and value == pattern or (
        isinstance(value, (int, float)) and isinstance(pattern, (int, float))
        and not isinstance(value, bool) and not isinstance(pattern, bool) and value == pattern
    )


def _from_end(dim: int, rank: int) -> int:
    """A dimension as a negative index: the same number at every rank with the same trailing dims."""
    return dim - rank if dim >= 0 else dim


def _same(bound: Any, value: Any) -> bool:
    if isinstance(bound, Node) or isinstance(value, Node):
        return bound is value
    return type(bound) is type(value) and bound == value


class _Explainer:
    """Records the deepest place a match failed, for ``explain_miss``."""

    def __init__(self) -> None:
        self.depth = 0
        self.deepest: tuple[int, str] = (-1, "")

    def fail(self, text: str) -> bool:
        if self.depth > self.deepest[0]:
            self.deepest = (self.depth, text)
        return False


_explainer: _Explainer | None = None


def _describe(value: Any) -> str:
    if isinstance(value, Node):
        return f"node {value.name} ({value.target})" if value.op == "call_function" else f"{value.op} {value.name}"
    return repr(value)


def _match_op(pattern: Op, value: Any, state: _State) -> bool:
    explainer = _explainer
    if explainer is None:
        return _match_op_inner(pattern, value, state)
    explainer.depth += 1
    try:
        matched = _match_op_inner(pattern, value, state)
        if not matched:
            explainer.fail(f"wanted {pattern.target} but found {_describe(value)}")
        return matched
    finally:
        explainer.depth -= 1


def _note(text: str) -> bool:
    """Record a specific reason one level deeper than the op being matched; always False."""
    if _explainer is not None:
        _explainer.depth += 1
        _explainer.fail(text)
        _explainer.depth -= 1
    return False


def _arg_name(node: Node, index: int) -> str:
    if isinstance(node.target, _torch.OpOverload) and index < len(node.target._schema.arguments):
        return f"{index} ({node.target._schema.arguments[index].name})"
    return str(index)


def _match_op_inner(pattern: Op, value: Any, state: _State) -> bool:
    if not isinstance(value, Node) or value.op != "call_function":
        return False
    if not target_matches(pattern.target, value.target):
        if _is_identity(value) and value not in state.nodes:
            trial = state.fork()
            trial.nodes[value] = id(pattern)
            if _match_op(pattern, value.args[0], trial):
                state.adopt(trial)
                return True
        if _optional(pattern) and pattern.args:
            trial = state.fork()
            if _match(pattern.args[0], value, trial):
                state.adopt(trial)
                return True
        return False
    # A pattern element used twice (a DAG) must be the same node both times, and vice versa.
    if id(pattern) in state.elements or value in state.nodes:
        return state.elements.get(id(pattern)) is value
    if pattern.where is not None and not _where_holds(pattern.where, value, state):
        return _note(f"{_describe(value)} fails {pattern.where}")
    if pattern.trailing is not None and not _keeps_trailing(value, pattern.trailing):
        return _note(f"{_describe(value)} does not keep its last {pattern.trailing} sizes, as the traced view did")
    args = node_args(value)
    rank = _first_tensor_rank(args)
    orders = [list(pattern.args)]
    if pattern.commutative and len(pattern.args) >= 2:
        orders.append([pattern.args[1], pattern.args[0], *pattern.args[2:]])
    for order in orders:
        trial = state.fork()
        trial.nodes[value] = id(pattern)
        trial.elements[id(pattern)] = value
        if len(order) > len(args):
            continue
        mismatch = next((i for i, (p, v) in enumerate(zip(order, args)) if not _match(p, v, trial, rank)), None)
        if mismatch is not None:
            if not isinstance(order[mismatch], (Op, Alt)):
                _note(f"{_describe(value)} argument {_arg_name(value, mismatch)}: {_argument_miss(order[mismatch], args[mismatch], trial)}")
            continue
        if not all(_kwarg_matches(value, args, key, p, trial, rank) for key, p in pattern.kwargs):
            continue
        if pattern.name is not None:
            if pattern.name in trial.bindings and trial.bindings[pattern.name] is not value:
                continue
            trial.bindings[pattern.name] = value
        state.adopt(trial)
        return True
    return False


def _argument_miss(pattern: Any, value: Any, state: _State) -> str:
    """Why a non-op pattern argument missed: the constraint a ``Var``'s ``where`` failed
    (dtype, rank, shape, check), else what was wanted and what was found."""
    if isinstance(pattern, Var) and pattern.where is not None:
        # A copy of the sizes: explaining a miss must not bind the sizes it names.
        failed = where_miss(pattern.where, value, dict(state.sizes))
        if failed is not None:
            return f"{pattern.name} {failed}"
    return f"wanted {pattern!r}, found {_describe(value)}"


def _kwarg_matches(node: Node, args: list[Any], key: str, pattern: Any, state: _State, rank: int | None) -> bool:
    index = _kwarg_index(node.target, key)
    if index is None:
        return _match(pattern, node.kwargs.get(key, _MISSING), state, rank)
    return _match(pattern, args[index], state, rank)


def _keeps_trailing(node: Node, trailing: int) -> bool:
    source = node.args[0] if node.args else None
    out = node.meta.get("val")
    inp = source.meta.get("val") if isinstance(source, Node) else None
    if not isinstance(out, torch.Tensor) or not isinstance(inp, torch.Tensor):
        return False
    if trailing == 0:
        return True
    if out.dim() < trailing or inp.dim() < trailing:
        return False
    return tuple(out.shape[-trailing:]) == tuple(inp.shape[-trailing:])


MATCHED_STRUCTURE = 1 << 30  # deeper than any pattern tree: the structure matched


def explain_miss(pattern: Pattern, roots: tuple[Any, ...], anchor: Node) -> str:
    """Why ``pattern`` does not match at ``anchor``: the deepest mismatch, in one line."""
    depth, text = deepest_miss(pattern, roots, anchor)
    return f"at depth {depth}: {text}" if 0 <= depth < MATCHED_STRUCTURE else text


def deepest_miss(pattern: Pattern, roots: tuple[Any, ...], anchor: Node) -> tuple[int, str]:
    """How far ``pattern`` got at ``anchor`` and what stopped it there: ``(depth, reason)``.

    Depth counts pattern ops matched into the tree (-1: not even the root's target); a match
    that only its check or a further output refused ranks above every structural miss."""
    global _explainer
    _explainer = _Explainer()
    try:
        state = _State()
        if _match(roots[0], anchor, state):
            match = match_pattern(pattern, roots, anchor)
            if match is None:
                if len(roots) > 1:
                    return MATCHED_STRUCTURE, "the first output matches; a further output was not found among the users of its bindings"
                return MATCHED_STRUCTURE, "the structure matches; the pattern's check rejected it"
            return MATCHED_STRUCTURE + 1, "it matches"
        depth, text = _explainer.deepest
        return (depth, text) if text else (-1, f"wanted {roots[0]!r}, found {_describe(anchor)}")
    finally:
        _explainer = None


def match_pattern(pattern: Pattern, roots: tuple[Any, ...], anchor: Node) -> Match | None:
    """Match ``pattern`` with its first root at ``anchor``; further roots are searched among
    the users of what the first root bound. Returns None when it does not match."""
    state = _State()
    if not _match(roots[0], anchor, state):
        return None
    found = [anchor]
    for root in roots[1:]:
        state_after = _match_more(root, state, found)
        if state_after is None:
            return None
        state = state_after
    match = Match(pattern, tuple(found), list(state.nodes), dict(state.bindings))
    verdict = pattern.check(match) if pattern.check is not None else True
    if isinstance(verdict, str):
        match.refused = verdict
        return match
    return match if verdict else None


def _match_more(root: Any, state: _State, found: list[Node]) -> _State | None:
    candidates: list[Node] = []
    for bound in list(state.bindings.values()) + list(state.nodes):
        if isinstance(bound, Node):
            candidates.extend(u for u in bound.users if u not in state.nodes and u not in candidates)
    for candidate in candidates:
        if candidate in found:
            continue
        trial = state.fork()
        if _match(root, candidate, trial):
            found.append(candidate)
            return trial
    return None

