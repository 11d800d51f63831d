"""Own ``from_trace``: build a search pattern by tracing ordinary torch code.

The search function is traced with ``make_fx`` on small example tensors, through the same
decomposition table that the program was lowered with (a ``decompose`` step's target opset),
so a pattern matches what the program's graphs actually contain: when canonicalization changes,
the pattern changes with it instead of silently missing. Tracing happens lazily, once per
opset, and the result is cached.

The traced graph becomes ``Op`` nodes. Inputs become ``Var``s named after the function's
parameters. Literal arguments stay literals that must be equal, except: sizes (``SymInt[]``
arguments such as a view's shape) match anything, checked instead, for views, by their rank and
by how many trailing sizes they keep; ``dim`` arguments count from the end, so a pattern traced
at rank 2 matches the same ops at rank 3 (a ``Linear`` output with a batch dim); and a float
equal to a non-tensor example argument binds that argument's name. ``pin_ranks=True`` keeps every
op's traced rank instead (and dims match modulo it), for patterns whose meaning depends on it.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.fx import Node

from passkit import _torch
from passkit.patterns.matcher import VIEW_OPS, node_args
from passkit.patterns.model import ANY, Alt, Dim, Op, Pattern, Var, Where

__all__ = ["TracedSearch", "from_trace"]

_SIZE_NAMES = frozenset({"size", "shape", "sizes", "stride"})
_DIM_NAMES = frozenset({"dim", "dim0", "dim1", "start_dim", "end_dim"})
_lock = threading.Lock()
_LOWERED: dict[tuple[Any, Any, Any], tuple[Op, ...]] = {}


@dataclass(frozen=True)
class TracedSearch:
    """A search function with example argument specs: plain data, lowered on demand."""

    fn: Callable[..., Any]
    names: tuple[str, ...]
    specs: tuple[Any, ...]  # (shape, dtype) for tensors, the value itself for scalars
    where: tuple[tuple[str, Where], ...] = ()
    pin_ranks: bool = False

    def lower(self, canonical: Any = None) -> tuple[Op, ...]:
        """The search roots as ``Op`` trees, traced through ``canonical.table`` (a program's
        ``TargetOpset``) if given."""
        # A TargetOpset compares by its names only; a training main's canonical form has the same
        # names and a smaller table (``rewrite``'s ``_canonical_for``), so the ops are the key too.
        key = (self, canonical, frozenset(canonical.table) if canonical is not None else None)
        with _lock:
            cached = _LOWERED.get(key)
        if cached is None:
            table = dict(canonical.table) if canonical is not None else None
            cached = _lower(self, table)
            with _lock:
                _LOWERED[key] = cached
        return cached


def _example(spec: Any) -> Any:
    if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], torch.dtype):
        shape, dtype = spec
        # Zeros: tracing never reads values, and drawing random ones would move the caller's RNG.
        return torch.zeros(shape, dtype=dtype)
    return spec


def _lower(search: TracedSearch, table: dict[Any, Any] | None) -> tuple[Op, ...]:
    args = [_example(spec) for spec in search.specs]
    gm = _torch.trace_graph(search.fn, args, pre_dispatch=False, decompositions=table)
    where = dict(search.where)
    scalars = {spec: name for name, spec in zip(search.names, search.specs) if isinstance(spec, float)}
    env: dict[Node, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, name in zip(placeholders, search.names):
        env[node] = Var(name, where.get(name))
    roots: tuple[Any, ...] = ()
    for node in gm.graph.nodes:
        if node.op == "call_function":
            env[node] = _to_op(node, env, scalars, search.pin_ranks)
        elif node.op == "output":
            outs = node.args[0]
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            roots = tuple(env[o] for o in outs)
    for root in roots:
        if not isinstance(root, Op):
            raise ValueError(f"from_trace({search.fn.__qualname__}): every output must be computed, not an input")
    return roots


def _to_op(node: Node, env: dict[Node, Any], scalars: dict[float, str], pin_ranks: bool) -> Op | Alt:
    target = node.target
    schema_args = target._schema.arguments if isinstance(target, _torch.OpOverload) else []
    # Unpinned, a dim counts from the end (extra leading dims are batch dims); pinned, every op
    # keeps its traced rank and a dim matches modulo it.
    traced_rank = None if pin_ranks else _first_tensor_rank(node)

    def convert(value: Any, index: int) -> Any:
        argument = schema_args[index] if index < len(schema_args) else None
        if isinstance(value, Node):
            return env[value]
        if argument is not None and argument.name in _SIZE_NAMES:
            return ANY
        if isinstance(value, float) and value in scalars:
            return Var(scalars[value])
        if argument is not None and argument.name in _DIM_NAMES and isinstance(value, int):
            return Dim(value, traced_rank)
        if traced_rank is not None and argument is not None and argument.name in _DIM_NAMES and _ints(value):
            return tuple(Dim(v, traced_rank) for v in value)
        if isinstance(value, (list, tuple)):
            return tuple(env[v] if isinstance(v, Node) else v for v in value)
        return value

    # Every schema argument, defaults written out: a default left unsaid must still be checked
    # (gelu's approximate="none" is what tells it from the tanh form).
    values = node_args(node)
    args = [convert(value, i) for i, value in enumerate(values)]
    for index, argument in enumerate(schema_args):
        # Device and layout describe where the trace ran, not what the pattern means.
        if argument.name in ("device", "layout", "pin_memory"):
            args[index] = ANY
    kwargs: dict[str, Any] = {}
    val = node.meta.get("val")
    # A view's rank says which sizes it keeps, so it stays pinned; other ops match any rank.
    pinned = pin_ranks or target in VIEW_OPS
    where = Where(rank=val.dim()) if pinned and isinstance(val, torch.Tensor) else None
    trailing = _trailing_kept(node) if target in VIEW_OPS else None
    op = Op(target, *args, where=where, trailing=trailing, **kwargs)
    if target is torch.ops.aten.transpose.int and len(args) == 3:
        # transpose(x, a, b) is transpose(x, b, a): user code writes both.
        return Alt(op, Op(target, args[0], args[2], args[1], where=where))
    return op


def _first_tensor_rank(node: Node) -> int | None:
    for arg in node.args:
        val = arg.meta.get("val") if isinstance(arg, Node) else None
        if isinstance(val, torch.Tensor):
            return val.dim()
    return None


def _ints(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


def _trailing_kept(node: Node) -> int:
    out, inp = node.meta["val"], node.args[0].meta["val"]
    kept = 0
    while kept < min(out.dim(), inp.dim()) and out.shape[-1 - kept] == inp.shape[-1 - kept]:
        kept += 1
    return kept


def from_trace(
    search_fn: Callable[..., Any],
    example_args: Sequence[Any],
    replace: Callable[..., Any] | None = None,
    *,
    build: Callable[..., Any] | None = None,
    name: str | None = None,
    benefit: int = 1,
    where: dict[str, Where] | None = None,
    pin_ranks: bool = False,
    check: Callable[[Any], bool] | None = None,
    description: str = "",
    keep: Sequence[str] = (),
) -> Pattern:
    """A pattern whose search is ``search_fn`` traced on ``example_args``.

    Tensors in ``example_args`` are only something to trace on: the pattern matches any rank,
    size and dtype (use distinct sizes, so views are told apart; a view keeps its traced rank,
    and a ``dim`` counts from the end, so extra leading dims match). Pin what must hold with
    ``where`` (``{"x": Where(rank=2, dtype=torch.float32)}``), or every op's traced rank with
    ``pin_ranks=True``. A float stands for a scalar parameter and binds it by name. ``replace``
    (or ``build``) receives the bindings by the search function's parameter names.
    """
    params = list(inspect.signature(search_fn).parameters)
    if len(params) != len(example_args):
        raise ValueError(
            f"from_trace({search_fn.__qualname__}): {len(example_args)} example args for {len(params)} parameters"
        )
    specs = tuple(
        (tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in example_args
    )
    search = TracedSearch(search_fn, tuple(params), specs, tuple(sorted((where or {}).items())), pin_ranks)
    return Pattern(
        name=name or search_fn.__name__,
        search=search,
        replace=replace,
        build=build,
        benefit=benefit,
        check=check,
        description=description or (inspect.getdoc(search_fn) or "").split("\n")[0],
        keep=tuple(keep),
    )
