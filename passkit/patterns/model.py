"""Own the pattern data model: what a pattern is, as plain, hashable, fingerprintable data.

A search pattern is a small tree (or, with several roots, a DAG) of frozen dataclasses:

- ``Op(target, *args, commutative=False, where=None, name=None)`` matches a ``call_function``
  node whose target is the ATen overload ``target``, or any overload of an overload packet;
- ``Var(name, where=None)`` binds whatever stands there (a node or a literal) to ``name``; the
  same name twice must bind the same thing;
- ``ANY`` (a ``Wildcard``) matches anything and binds nothing;
- ``Alt(a, b, ...)`` matches the first alternative that matches;
- ``Dim(d)`` matches an int dimension equal to ``d`` modulo the rank of the op's first tensor
  argument (``-1`` and ``3`` on a rank-4 tensor); ``Dim(d, rank=r)`` counts it from the end
  instead (a dimension traced at rank ``r``, matched at any rank);
- any other Python value is a literal that must be equal.

``Where`` is a predicate on a node's ``meta["val"]``: dtype, rank, and a symbolic shape whose
string entries name sizes that must agree across the whole match. A ``Pattern`` pairs a search
(one root or a tuple of roots, for multi-output patterns, or a traced search from
``from_trace``) with a replacement, a benefit (higher first) and an optional extra ``check``.
A ``PatternSet`` is a named tuple of patterns, each name once; sets compose with ``+``. A set may declare
``options`` that a pipeline sets per ``rewrite`` step (the ``attention`` set's CPU size gate),
and a ``tolerance=(rtol, atol)`` when its rewrites change numerics on purpose.

Everything is frozen and hashable; ``fingerprint()`` is stable across processes (callables are
named by their qualified name and source hash), so the compile cache can key on pattern sets.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable

from passkit.verify.compare import loosest

__all__ = [
    "ANY",
    "Alt",
    "Dim",
    "Op",
    "Pattern",
    "PatternSet",
    "Var",
    "Where",
    "Wildcard",
    "fingerprint_of",
]


@dataclass(frozen=True)
class Where:
    """A predicate on ``meta["val"]``: every given field must hold.

    ``dtype``: a dtype or a tuple of acceptable dtypes. ``rank``: an int or a tuple of ints.
    ``shape``: one entry per dimension, each an int (exact), ``None`` (any) or a name (the same
    name must be the same size everywhere in one match). ``check``: ``f(val) -> bool``.
    """

    dtype: Any = None
    rank: int | tuple[int, ...] | None = None
    shape: tuple[int | str | None, ...] | None = None
    check: Callable[[Any], bool] | None = None

    def __repr__(self) -> str:
        # Only what was asked for: a miss message reads "fails Where(rank=2)".
        given = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if getattr(self, f.name) is not None]
        return f"Where({', '.join(given)})"


@dataclass(frozen=True)
class Wildcard:
    """Matches anything, binds nothing."""

    def __repr__(self) -> str:
        return "ANY"


ANY = Wildcard()


@dataclass(frozen=True)
class Var:
    """A named binding: matches anything (that satisfies ``where``) and remembers it."""

    name: str
    where: Where | None = None


@dataclass(frozen=True)
class Dim:
    """An int dimension, equal modulo the rank of the op's first tensor argument.

    With ``rank`` (the rank it was traced at, set by ``from_trace`` when ranks are not pinned),
    the dimension counts from the end instead: ``Dim(1, rank=2)`` is the last dimension at any
    rank, since a pattern traced without pinned ranks matches extra leading (batch) dimensions.
    """

    value: int
    rank: int | None = None


@dataclass(frozen=True, init=False)
class Alt:
    """The first of several alternatives that matches."""

    options: tuple[Any, ...]

    def __init__(self, *options: Any) -> None:
        object.__setattr__(self, "options", tuple(options))


@dataclass(frozen=True, init=False)
class Op:
    """A call of an ATen overload (or any overload of a packet) with argument patterns.

    Arguments past the ones given are not looked at. ``kwargs`` are matched by schema name.
    ``commutative`` tries the first two arguments in both orders. ``name`` binds the node.
    ``trailing`` (set by ``from_trace`` on views) is how many trailing sizes the view keeps.
    """

    target: Any
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    commutative: bool
    where: Where | None
    name: str | None
    trailing: int | None

    def __init__(
        self,
        target: Any,
        *args: Any,
        commutative: bool = False,
        where: Where | None = None,
        name: str | None = None,
        trailing: int | None = None,
        **kwargs: Any,
    ) -> None:
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "args", tuple(_freeze(a) for a in args))
        object.__setattr__(self, "kwargs", tuple(sorted((k, _freeze(v)) for k, v in kwargs.items())))
        object.__setattr__(self, "commutative", commutative)
        object.__setattr__(self, "where", where)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "trailing", trailing)


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


@dataclass(frozen=True)
class Pattern:
    """One rewrite: a search, a replacement, a benefit and an optional extra check.

    ``search``: an ``Op`` (one output), a tuple of ``Op`` (several outputs, matched with shared
    bindings), or a traced search from :func:`passkit.patterns.from_trace`.
    ``replace``: ``f(**bindings)`` written in torch and traced into the graph; or ``build``:
    ``f(builder, **bindings)`` that adds nodes with ``builder.call(op, ...)``. Either returns
    one value per search output.
    ``check``: ``f(match) -> bool | str``, a last word on a match (``match.bindings``,
    ``match.val``): False is no match; a string refuses the match and is the reason the
    ``rewrite`` step reports under ``refused`` (a cost model's "too small to pay").
    ``keep``: op names that a ``decompose`` step's table must leave whole after this pattern
    applied (the ``rewrite`` pass adds them to the program's target opset).
    """

    name: str
    search: Any
    replace: Callable[..., Any] | None = None
    build: Callable[..., Any] | None = None
    benefit: int = 1
    check: Callable[[Any], bool | str] | None = None
    description: str = ""
    # Ops (``"aten.x.default"`` names) the replacement needs kept whole by later lowering,
    # such as the kernels a composite op dispatches to when ``joint`` traces it.
    keep: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.replace is None) == (self.build is None):
            raise ValueError(f"pattern {self.name!r}: give exactly one of replace= or build=")

    def roots(self, canonical: Any = None) -> tuple[Any, ...]:
        """The search roots, with a traced search lowered for ``canonical`` (a TargetOpset)."""
        search = self.search
        if hasattr(search, "lower"):
            search = search.lower(canonical)
        return search if isinstance(search, tuple) else (search,)

    def fingerprint(self) -> str:
        return fingerprint_of(self)


@dataclass(frozen=True)
class PatternSet:
    """Named patterns, applied together; ``a + b`` is both sets' patterns."""

    name: str
    patterns: tuple[Pattern, ...] = field(default_factory=tuple)
    description: str = ""
    # Op packets one of which a graph must call for any pattern to match (empty: no hint). A
    # graph without them is skipped before anything is traced.
    requires: tuple[Any, ...] = ()
    # What a pipeline may tune: a ``rewrite`` step's ``set_options.<name>`` table is validated
    # against ``options`` (a pydantic model) and the instance handed to ``configure``, which
    # returns the set to apply. Options narrow ``check``s; they never re-trace a search, so the
    # traces stay cached across values.
    options: Any = None
    configure: Callable[[PatternSet, Any], PatternSet] | None = None
    # ``(rtol, atol)`` the set's rewrites may move results by (an approximation by design, such
    # as a tanh GELU): a ``rewrite`` step applying it declares the loosest of its sets'.
    tolerance: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.tolerance is not None:
            if len(self.tolerance) != 2 or min(self.tolerance) < 0:
                raise ValueError(f"pattern set {self.name!r}: tolerance must be (rtol, atol), both >= 0, not {self.tolerance!r}")
            object.__setattr__(self, "tolerance", (float(self.tolerance[0]), float(self.tolerance[1])))
        # Counts, ``only``, vetoes and bisect's blame name patterns: two of one name are ambiguous.
        # One rule for several overloads is one pattern whose search is an ``Alt`` of them.
        seen: set[str] = set()
        for pattern in self.patterns:
            if pattern.name in seen:
                raise ValueError(f"pattern set {self.name!r} has two patterns named {pattern.name!r}")
            seen.add(pattern.name)

    def configured(self, values: dict[str, Any] | None) -> PatternSet:
        """This set as ``values`` (a ``set_options`` table) configure it; pydantic's
        ValidationError for values its ``options`` refuse, ValueError for a set without options."""
        if self.options is None or self.configure is None:
            if values:
                raise ValueError(f"pattern set {self.name!r} takes no options")
            return self
        return self.configure(self, self.options.model_validate(values or {}))

    def __add__(self, other: PatternSet) -> PatternSet:
        requires = self.requires + other.requires if self.requires and other.requires else ()
        tolerance = loosest((self.tolerance, other.tolerance))
        return PatternSet(f"{self.name}+{other.name}", self.patterns + other.patterns, requires=requires, tolerance=tolerance)

    def may_match(self, targets: set[Any]) -> bool:
        """Whether a graph calling ``targets`` could match (by the ``requires`` hint)."""
        if not self.requires:
            return True
        return any(t in self.requires or getattr(t, "overloadpacket", None) in self.requires for t in targets)

    def fingerprint(self) -> str:
        return fingerprint_of(self)


def _canonical(value: Any) -> str:
    if callable(value) and not isinstance(value, type) and not is_dataclass(value) and not _is_op(value):
        try:
            source = inspect.getsource(value)
        except (OSError, TypeError):
            source = ""
        digest = hashlib.sha256(source.encode()).hexdigest()[:12]
        return f"fn:{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}:{digest}"
    if is_dataclass(value) and not isinstance(value, type):
        inner = ",".join(f"{f.name}={_canonical(getattr(value, f.name))}" for f in fields(value))
        return f"{type(value).__name__}({inner})"
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_canonical(v) for v in value) + ")"
    return repr(value)


def _is_op(value: Any) -> bool:
    return type(value).__name__ in ("OpOverload", "OpOverloadPacket") or getattr(value, "__module__", "") == "_operator"


def fingerprint_of(value: Any) -> str:
    """A stable hex digest of a pattern, a set, or any pattern data."""
    return hashlib.sha256(_canonical(value).encode()).hexdigest()[:16]
