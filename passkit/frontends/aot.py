"""Own the entry points without Dynamo: ``aot_function`` and ``aot_module``.

A call traces the function with ``make_fx`` (``passkit.frontends.capture``) the first time it sees an input
signature, compiles it with the pipeline (``passkit.frontends.compiling.compile_program``) and keeps it, keyed on
the inputs' nesting, shapes, strides, dtypes, devices, grad requirements and duplicates, and on
grad mode; a non-tensor argument is part of the key by value. Keying tensors and plain lists of
them skips pytree, since its flatten costs more per call than a small model's compiled step.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import torch

from passkit import _torch
from passkit._torch import pytree
from passkit.frontends.compiling import DEFAULT_PIPELINE, Fallback, compile_program, resolve_pipeline
from passkit.frontends.capture import program_from_function
from passkit.frontends.data_dependent import explain_data_dependent
from passkit.core.report import Report
from passkit.runtime.subclasses import flat_inputs, with_subclasses

__all__ = ["aot_function", "aot_module", "AotModule"]

# make_fx keeps global tracing state (torch's patcher), so two threads tracing at once break each
# other; compiles without Dynamo (which has its own lock) take turns. Calls of compiled code don't.
_TRACE_LOCK = threading.RLock()


class _TracedCache:
    """Compiled programs for one traced function, keyed on what tracing specialised on."""

    def __init__(self, fn: Callable[..., Any], pipeline: Any, kinds: Callable[[int], Sequence[str]] | None) -> None:
        self.fn = fn
        self.pipeline = pipeline
        self.kinds = kinds
        self.entries: dict[Any, tuple[Callable[..., Any], Any]] = {}
        self.reports: list[Report] = []
        self.fallback = Fallback(pipeline)

    @staticmethod
    def _key(leaves: Sequence[Any]) -> Any:
        key: list[Any] = [torch.is_grad_enabled()]
        seen: dict[int, int] = {}
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                dup = seen.setdefault(id(leaf), len(seen))
                key.append((leaf.shape, leaf.stride(), leaf.dtype, leaf.device, leaf.requires_grad, leaf.is_leaf, dup))
            else:
                key.append(("const", type(leaf), repr(leaf)))
        return tuple(key)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _torch.tracing_active():
            # Another compile is tracing this call (torch's nested aot_function, Dynamo): it
            # records the function's own ops; compiled kernels would see its fake tensors.
            return self.fn(*args, **kwargs)
        flat = _tensors_and_lists(args, kwargs)
        if flat is not None:
            nesting, leaves = flat
            key = (nesting, self._key(leaves))
        else:
            leaves, in_spec = pytree.tree_flatten((args, kwargs))
            if any(_torch.is_traced_value(leaf) for leaf in leaves):
                return self.fn(*args, **kwargs)  # fake or functional values: traced outside a mode
            key = (in_spec, self._key(leaves))
        entry = self.entries.get(key)
        if entry is None:
            if flat is not None:  # building needs pytree's spec, to rebuild the arguments when tracing
                in_spec = pytree.tree_flatten((args, kwargs))[1]
            entry = self.entries[key] = self._build(leaves, in_spec)
        compiled, out_spec = entry
        unique = _unique_tensors(leaves)
        outs = compiled(*unique)
        if out_spec is None:  # eager fallback returned the user's own structure
            return outs
        return pytree.tree_unflatten(list(outs), out_spec)

    def _call_user_fn(self, rebuilt: list[Any], in_spec: Any) -> Any:
        args, kwargs = pytree.tree_unflatten(rebuilt, in_spec)
        return self.fn(*args, **kwargs)

    def _build(self, leaves: list[Any], in_spec: Any) -> tuple[Callable[..., Any], Any]:
        unique = _unique_tensors(leaves)
        index = {id(t): i for i, t in enumerate(unique)}
        positions = [index[id(leaf)] if isinstance(leaf, torch.Tensor) else -1 for leaf in leaves]
        out_spec_box: list[Any] = []

        def flat_fn(*tensors: Any) -> tuple[Any, ...]:
            rebuilt = [tensors[p] if p >= 0 else leaf for p, leaf in zip(positions, leaves)]
            out = self._call_user_fn(rebuilt, in_spec)
            flat_out, out_spec = pytree.tree_flatten(out)
            out_spec_box[:] = [out_spec]
            return tuple(flat_out)

        try:
            kinds = self.kinds(len(unique)) if self.kinds else None
            # A program without tensor inputs traces its factory ops for real; the caller's
            # random numbers must still be there for the compiled call, as in eager.
            with _TRACE_LOCK, torch.random.fork_rng(devices=[]), _torch.saved_tensors_hooks_deferred():
                program = program_from_function(flat_fn, unique, kinds=kinds)
                compiled = compile_program(program, flat_inputs(program, unique), self.pipeline, reports=self.reports)
            return with_subclasses(compiled, program), out_spec_box[0]
        except Exception as exc:  # noqa: BLE001 - every failure goes through on_error

            def eager(*tensors: Any) -> Any:
                return self._call_user_fn([tensors[p] if p >= 0 else leaf for p, leaf in zip(positions, leaves)], in_spec)

            return self.fallback.handle(explain_data_dependent(exc), eager), None


_PLAIN_TENSORS = _torch.PLAIN_TENSOR_TYPES


def _tensors_and_lists(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple[int, ...], list[Any]] | None:
    """Arguments that are plain tensors and plain lists of them, without keywords (every
    ``AotModule`` call, most ``aot_function`` calls): their leaves in pytree's order and how they
    nest (-1 a tensor, n a list of n), read without pytree, whose flatten and spec hashing cost
    more per call than the compiled MLP's runtime. Anything else (a subclass, a dict, a number)
    returns None: it goes through pytree."""
    if kwargs:
        return None
    nesting: list[int] = []
    leaves: list[Any] = []
    for arg in args:
        if type(arg) in _PLAIN_TENSORS:
            nesting.append(-1)
            leaves.append(arg)
        elif type(arg) is list and all(type(item) in _PLAIN_TENSORS for item in arg):
            nesting.append(len(arg))
            leaves.extend(arg)
        else:
            return None
    return tuple(nesting), leaves


def _unique_tensors(leaves: Sequence[Any]) -> list[torch.Tensor]:
    seen: set[int] = set()
    unique = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and id(leaf) not in seen:
            seen.add(id(leaf))
            unique.append(leaf)
    return unique


def aot_function(fn: Callable[..., Any], pipeline: Any = DEFAULT_PIPELINE, **settings: Any) -> Callable[..., Any]:
    """Compile ``fn`` with ``pipeline`` without Dynamo: trace with ``make_fx`` per input signature.

    The result has ``passkit_reports``. The same tensor passed twice is traced once.
    """
    cache = _TracedCache(fn, resolve_pipeline(pipeline, settings), kinds=None)

    def compiled(*args: Any, **kwargs: Any) -> Any:
        return cache(*args, **kwargs)

    compiled.passkit_reports = cache.reports  # type: ignore[attr-defined]
    compiled.passkit_fallbacks = cache.fallback.reasons  # type: ignore[attr-defined]
    compiled.__wrapped__ = fn  # type: ignore[attr-defined]
    return compiled


class AotModule(torch.nn.Module):
    """``mod`` compiled with ``aot_function``; parameters and buffers are program inputs."""

    def __init__(self, mod: torch.nn.Module, pipeline: Any) -> None:
        super().__init__()
        self.mod = mod
        self._cache = _TracedCache(self._functional_forward, pipeline, kinds=self._kinds)
        self.passkit_reports = self._cache.reports
        self.passkit_fallbacks = self._cache.fallback.reasons

    def _state(self) -> tuple[list[str], list[torch.Tensor], int]:
        params = dict(self.mod.named_parameters(remove_duplicate=False))
        buffers = dict(self.mod.named_buffers(remove_duplicate=False))
        return [*params, *buffers], [*params.values(), *buffers.values()], len(params)

    def _kinds(self, n_unique: int) -> list[str]:
        names, _, n_params = self._state()
        kinds = ["param"] * n_params + ["buffer"] * (len(names) - n_params)
        return (kinds + ["user"] * n_unique)[:n_unique]

    def _functional_forward(self, state: list[torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        names, _, _ = self._state()
        return torch.func.functional_call(self.mod, dict(zip(names, state)), args, kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        _, tensors, _ = self._state()
        return self._cache(tensors, *args, **kwargs)


def aot_module(mod: torch.nn.Module, pipeline: Any = DEFAULT_PIPELINE, **settings: Any) -> AotModule:
    """Compile ``mod`` with ``pipeline`` without Dynamo (``make_fx`` over ``functional_call``)."""
    return AotModule(mod, resolve_pipeline(pipeline, settings))
