"""Own ``max_saved`` across the graphs of one compiled model.

``partition.min_cut``'s ``max_saved`` limits what one joint graph saves for its backward. Dynamo
splits a model at graph breaks into several graphs whose forwards all run before the backward,
so their saved tensors are alive together; a limit per graph would let the model as a whole
exceed it. The backend therefore keeps a :class:`SavedLedger` per compiled model:

- each training graph is keyed by the Dynamo frame it came from (a recompile of that frame, for
  new shapes, replaces its entry rather than adding to it), and compiles with the limit less
  the bytes the model's other graphs save;
- a graph that cannot fit in what is left takes its smallest plan, and the graphs compiled
  before it are re-planned at their next call to fit the rest (the step that found this ran
  under their old plans; a warning says so);
- when the graphs' smallest plans together exceed the limit, compiling fails with one line.

Nothing here runs for a pipeline without ``max_saved``: its graphs compile as before, unwrapped.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from torch.fx import GraphModule

from passkit.errors import PassError
from passkit.passes.partition_min_cut import SMALLEST_STAT, parse_size
from passkit.frontends.user_warnings import warn_at_user_code

__all__ = ["SavedLedger", "limited_steps"]

LIMIT_OPTION = "max_saved"
SAVED_STAT = "saved_bytes"

Compile = Callable[[GraphModule, Sequence[Any], Any], tuple[Callable[..., Any], Any]]
"""(graph, inputs, pipeline) -> (compiled callable, its report)."""


def limited_steps(pipeline: Any) -> list[Any]:
    """The enabled steps of ``pipeline`` whose ``max_saved`` is set."""
    return [
        step for step in pipeline.steps
        if step.enabled and getattr(step.options, LIMIT_OPTION, None) is not None
    ]


def _with_limit(pipeline: Any, limit: int) -> Any:
    """``pipeline`` with every set ``max_saved`` lowered to ``limit`` bytes (never raised)."""
    steps = []
    for step in pipeline.steps:
        own = getattr(step.options, LIMIT_OPTION, None)
        if step.enabled and own is not None and limit < parse_size(own):
            options = type(step.options).model_validate({**dict(step.options), LIMIT_OPTION: limit})
            step = dataclasses.replace(step, options=options)
        steps.append(step)
    return dataclasses.replace(pipeline, steps=tuple(steps))


def _limit_of(pipeline: Any) -> tuple[int, str | int]:
    """The smallest ``max_saved`` in ``pipeline``, in bytes and as written."""
    written = min((getattr(s.options, LIMIT_OPTION) for s in limited_steps(pipeline)), key=parse_size)
    return parse_size(written), written


def _stat(report: Any, name: str) -> int:
    """The largest value of stat ``name`` in the report's records (0 when no step recorded it)."""
    values = [r.stats[name] for r in getattr(report, "records", []) if isinstance(r.stats.get(name), int)]
    return max(values, default=0)


def _smallest_saved(exc: BaseException | None) -> int | None:
    """The fewest bytes a graph can save, when ``exc`` (or its cause) is ``max_saved`` refusing it."""
    while exc is not None:
        smallest = getattr(exc, "smallest_saved", None)
        if isinstance(smallest, int):
            return smallest
        exc = exc.__cause__ or exc.__context__
    return None


def _pristine(gm: GraphModule) -> GraphModule:
    """A copy of Dynamo's graph to compile again later: capture rewrites the graph it is given.
    Attributes (parameters, constants) are shared, not copied."""
    return GraphModule(gm, copy.deepcopy(gm.graph))


@dataclass
class _Entry:
    saved: int
    smallest: int
    graph: _Replannable


class _Replannable:
    """A compiled graph that the ledger can re-plan under a new limit before its next call."""

    def __init__(self, compiled: Callable[..., Any], gm: GraphModule, pipeline: Any, compile_fn: Compile) -> None:
        self.compiled = compiled
        self.gm = gm
        self.pipeline = pipeline
        self.compile_fn = compile_fn
        self.pending: int | None = None
        self.entry: _Entry | None = None

    def __call__(self, *args: Any) -> Any:
        if self.pending is not None:
            limit, self.pending = self.pending, None
            self.compiled, report = self.compile_fn(_pristine(self.gm), list(args), _with_limit(self.pipeline, limit))
            if self.entry is not None:
                self.entry.saved = _stat(report, SAVED_STAT)
        return self.compiled(*args)


class SavedLedger:
    """What each training graph of one compiled model saves, so ``max_saved`` holds for them all."""

    def __init__(self) -> None:
        self.entries: dict[Any, _Entry] = {}

    def compile(self, key: Any, gm: GraphModule, inputs: Sequence[Any], pipeline: Any, compile_fn: Compile) -> Any:
        """Compile one graph of the model (from frame ``key``) under what the limit leaves it."""
        limit, written = _limit_of(pipeline)
        pristine = _pristine(gm)
        others = {k: e for k, e in self.entries.items() if k != key}
        taken = sum(e.saved for e in others.values())
        try:
            compiled, report = compile_fn(gm, inputs, _with_limit(pipeline, max(limit - taken, 0)) if taken else pipeline)
        except Exception as exc:
            own = _smallest_saved(exc)
            if own is None or not others:
                raise
            need = own + sum(e.smallest for e in others.values())
            if need > limit:
                raise PassError(
                    f"max_saved = {written!r} cannot be met by this model: Dynamo split it into {len(others) + 1} "
                    f"graphs, whose smallest plans save {need} bytes together"
                ) from None
            # This graph takes its smallest plan; the graphs before it shrink to fit the rest.
            compiled, report = compile_fn(_pristine(pristine), inputs, _with_limit(pipeline, own))
            self._replan(others, limit - _stat(report, SAVED_STAT), written)
        graph = _Replannable(compiled, pristine, pipeline, compile_fn)
        graph.entry = self.entries[key] = _Entry(_stat(report, SAVED_STAT), _stat(report, SMALLEST_STAT), graph)
        return graph

    def _replan(self, others: dict[Any, _Entry], left: int, written: str | int) -> None:
        excess = sum(e.saved for e in others.values()) - left
        for entry in sorted(others.values(), key=lambda e: e.smallest - e.saved):  # most room first
            if excess <= 0:
                break
            shrunk = max(entry.smallest, entry.saved - excess)
            excess -= entry.saved - shrunk
            entry.graph.pending = entry.saved = shrunk
        warn_at_user_code(
            f"passkit: max_saved = {written!r} holds for the whole model, which Dynamo split into "
            f"{len(others) + 1} graphs; the graphs compiled first are re-planned at their next call to fit "
            "(this step saved more than the limit)"
        )
