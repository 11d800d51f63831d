"""Own what the runtime wrapper makes of outputs that are views, and their gradients.

An output that views an intermediate is made outside the wrapper's ``autograd.Function`` from its
base (so in-place writes to it work as in eager), unless the view reads an element of its base
twice, whose gradient the base's cannot give; an output an ``autograd.Function`` made that shares
an input's memory is made as a view of that input inside the wrapper's Function (so its gradient
passes the compiled backward); a recorded view's symbolic geometry is read off the computed
value where that is the view, else evaluated with the call's sizes; and an alias in another
dtype is made differentiably.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from passkit import _torch

if TYPE_CHECKING:
    from passkit.runtime.wrapper import CompiledProgram

__all__ = ["Geometry", "geometry_now", "grads_of_views", "recorded_geometry", "view_in_dtype",
           "views_of_inputs_made_here", "with_intermediate_bases"]


Geometry = tuple[tuple[int, ...], tuple[int, ...], int]


def _reads_an_element_twice(size: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether a view of this geometry may read one element of its base at two positions
    (``expand``, ``unfold`` with overlapping windows); ``False`` only where it surely reads none twice.

    Such a view's gradient cannot be recovered from its base's: the base's gradient sums the view's
    positions over each element they share, and gathering it back gives every position the sum.
    """
    dims = sorted((st, sz) for sz, st in zip(size, stride) if sz > 1)
    reach = 0  # the largest offset the smaller-stride dimensions reach
    for st, sz in dims:
        if st <= reach:
            return True
        reach += st * (sz - 1)
    return False


def with_intermediate_bases(ctx: Any, runtime: CompiledProgram, visible: tuple[Any, ...], args: Sequence[Any]) -> tuple[Any, ...]:
    """Return the base of each output that views an intermediate, and the views' geometry last.

    Autograd forbids in-place writes to a view made inside an ``autograd.Function``; eager's
    ``(x + 1).view(-1)`` allows them. As AOT Autograd does ("intermediate base"), the Function
    returns the base and the wrapper makes the view outside it. Bases shared by two outputs stay
    as they were (autograd rejects a tensor returned twice), so that case still raises loudly.
    A view that reads an element twice (``x.abs().expand(3, 4)``) stays as it was too: its
    gradient is not the base's gathered back (``_reads_an_element_twice``), and eager refuses
    in-place writes to it anyway.
    """
    if not runtime.view_slots:
        return visible
    ctx.view_geometry = {}
    views = [
        k for k in runtime.view_slots
        # An output marked non-differentiable is marked on the view itself: returned as it is.
        if k not in runtime.non_differentiable and isinstance(visible[k], torch.Tensor) and visible[k]._is_view()
    ]
    if not views:  # the common case, decided without building anything more
        return (*visible, {})
    inputs = {id(a) for a in args}
    bases: dict[int, tuple[torch.Tensor, Geometry, Geometry]] = {}
    for k in views:
        value = visible[k]
        if id(value._base) not in inputs:
            base = value._base
            geometry = (tuple(value.size()), tuple(value.stride()), value.storage_offset())
            bases[k] = (base, geometry, (tuple(base.size()), tuple(base.stride()), base.storage_offset()))
    shared = {id(b) for b, _, _ in bases.values() if sum(id(o[0]) == id(b) for o in bases.values()) > 1}
    shared |= {id(v) for k, v in enumerate(visible) if k not in bases}
    out = list(visible)
    for k, (base, geometry, base_geometry) in bases.items():
        value = visible[k]
        same_kind = (base.dtype, base.is_conj(), base.is_neg()) == (value.dtype, value.is_conj(), value.is_neg())
        # as_strided keeps no dtype view, conj or neg bit
        if id(base) not in shared and same_kind and not _reads_an_element_twice(geometry[0], geometry[1]):
            out[k] = base
            ctx.view_geometry[k] = (geometry, base_geometry)
    return (*out, {k: g for k, (g, _) in ctx.view_geometry.items()})


def grads_of_views(view_geometry: dict[int, tuple[Geometry, Geometry]], grad_outputs: Sequence[Any]) -> tuple[Any, ...]:
    """Turn the gradients of returned bases back into the gradients of the views they stand for."""
    grads = list(grad_outputs)
    for k, ((size, stride, offset), (base_size, base_stride, base_offset)) in view_geometry.items():
        grad = grads[k]
        if grad is None:
            continue
        if grad.stride() != base_stride or grad.storage_offset() != 0:
            laid_out = torch.empty_strided(base_size, base_stride, dtype=grad.dtype, device=grad.device)
            grad = laid_out.copy_(grad)
        grads[k] = grad.as_strided(size, stride, offset - base_offset)
    return tuple(grads)


def recorded_geometry(out: torch.Tensor, base: torch.Tensor, sources: dict[Any, Any]) -> tuple[Any, tuple[Any, ...]]:
    """An aliasing output's size, stride and offset from ``base``'s (a later call's input may
    start elsewhere in its memory: a view of a larger tensor), each symbolic one (a graph Dynamo
    compiled for any size) kept as its sympy expression, and the ``_torch.SymbolSource``s of the
    symbols those use (``sources``: every symbol the graph's inputs bind). Plain sympy, so the
    program holds no symbol of a fake mode (snapshots and reproducers copy it)."""
    used: set[Any] = set()

    def known(value: Any) -> Any:
        if isinstance(value, torch.SymInt):
            used.update(value.node.expr.free_symbols)
            return value.node.expr
        return int(value)

    offset = known(out.storage_offset() - base.storage_offset())
    view = tuple(map(known, out.shape)), tuple(map(known, out.stride())), offset
    return view, tuple(sources[s] for s in sorted(used, key=str) if s in sources)


def geometry_now(view: Any, value: Any, base: torch.Tensor, inputs: Sequence[Any] = (),
                 symbols: Sequence[Any] = ()) -> Geometry | None:
    """The geometry of a recorded view (offset from ``base``'s) for this call. Recorded with
    symbolic sizes (a graph Dynamo compiled for any size), it is the compiled value's own where
    that value is the view of ``base`` itself; otherwise (a code generator's copy) each
    expression is evaluated with the symbols read off this call's ``inputs`` (``symbols``:
    ``_torch.SymbolSource``s). ``None`` where a symbol has no source: then no alias can be made."""
    size, stride, offset = view
    if all(isinstance(v, int) for v in (*size, *stride, offset)):
        return size, stride, base.storage_offset() + offset
    if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() == base.untyped_storage().data_ptr():
        return tuple(value.size()), tuple(value.stride()), value.storage_offset()
    bindings = {source[0]: _torch.read_symbol(source, inputs) for source in symbols}

    def evaluate(entry: Any) -> int | None:
        if isinstance(entry, int):
            return entry
        known = entry.xreplace(bindings)
        return int(known) if isinstance(known, int) or known.is_number else None

    values = [evaluate(v) for v in (*size, *stride, offset)]
    if any(v is None for v in values):
        return None
    rank = len(size)
    return tuple(values[:rank]), tuple(values[rank:-1]), base.storage_offset() + values[-1]  # type: ignore[return-value, operator]


def views_of_inputs_made_here(outs: Sequence[Any], args: Sequence[Any], slots: Sequence[tuple[int, int, Any, Any]]) -> list[Any]:
    """Each ``made_by_function`` output as a view of its input, made inside the Function: it shares
    the input's memory as in eager whatever the code generator returned (Inductor copies), and its
    gradient passes the compiled backward, which runs the user's Function's own."""
    outs = list(outs)
    for k, index, view, symbols in slots:
        value, base = outs[k], args[index]
        if isinstance(value, torch.Tensor) and isinstance(base, torch.Tensor) and value.dtype == base.dtype:
            geometry = geometry_now(view, value, base, args, symbols)
            if geometry is not None:
                outs[k] = base.as_strided(*geometry)
    return outs


def view_in_dtype(base: torch.Tensor, value: torch.Tensor, size: Any, stride: Any, offset: int) -> torch.Tensor:
    """An alias of ``base`` in another dtype (``view_as_complex``/``view_as_real``), differentiably."""
    if value.is_complex() and base.dtype == value.real.dtype:
        real = base.as_strided((*size, 2), (*(2 * s for s in stride), 1), 2 * offset)
        return torch.view_as_complex(real)
    if base.is_complex() and value.dtype == base.real.dtype:
        return torch.view_as_real(base).as_strided(size, stride, offset)
    return value  # a reinterpreting view autograd cannot follow: the computed value, unaliased
