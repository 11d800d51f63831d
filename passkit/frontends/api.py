"""Own the public entry points through Dynamo: ``passkit.compile``, ``passkit.backend`` and the
``"passkit"`` backend name.

Dynamo hands each graph to ``PasskitBackend``, which captures it as a ``Program`` (lifting the
attributes Dynamo leaves on it, flattening tensor subclasses, refusing region calls that read
another layer's parameters), plans ``max_saved`` across the model's graphs, and compiles it with
``passkit.frontends.compiling``, which every way in shares. A frame Dynamo starts tracing for
passkit says so (``tracing``); each graph Dynamo hands over opens with a
``compiling``/``recompiling`` line (``passkit.frontends.recompiles``).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch
from torch.fx import GraphModule

from passkit import _torch
from passkit.frontends.capture import program_from_flat_graph, program_from_graph
from passkit.frontends.compile_options import apply_mode, split_options, warn_at_recompile_limit
from passkit.frontends.compiling import (
    DEFAULT_PIPELINE,
    Fallback,
    Progress,
    compile_program,
    load_pipeline,
    raise_when_called,
    resolve_pipeline,
)
from passkit.frontends.graph_attributes import lift_attributes
from passkit.regions.outline import TRACED_ONCE_NOTE
from passkit.core.program import Program
from passkit.core.progress import ProgressEvent, send
from passkit.frontends.recompiles import CompileAnnouncer
from passkit.core.report import Report
from passkit.frontends.saved_limit import SavedLedger, limited_steps
from passkit.frontends.synthetic_base import merge_written_views
from passkit.regions.stamped import StampedRegionError, refuse_regions_reading_other_layers
from passkit.runtime.subclasses import flatten_subclasses, with_subclasses
from passkit.regions.traced_once import tracing_each_layer_once

__all__ = [
    "compile",
    "backend",
    "dynamo_backend",
    "compile_program",
    "load_pipeline",
]

log = logging.getLogger("passkit")


class PasskitBackend:
    """A ``torch.compile`` backend that runs one pipeline; keeps one report per graph.

    ``torch.compile``'s ``mode`` and ``options`` arrive as keyword arguments (see
    ``passkit.frontends.compile_options``); each distinct pair resolves its pipeline once.
    """

    def __init__(self, pipeline: Any = DEFAULT_PIPELINE, progress: Progress | None = None, **settings: Any) -> None:
        _torch.on_dynamo_frame_start(_announce_tracing)
        self._pipeline_arg = pipeline
        self._settings = settings
        self._pipeline: Any = None
        self.progress = progress
        self.reports: list[Report] = []
        self.programs: list[Program] = []
        self._variants: dict[Any, Any] = {}
        self.fallbacks: list[str] = []
        self.saved_ledger = SavedLedger()  # max_saved across this model's graphs
        self.announcer = CompileAnnouncer()  # what each recompile of a frame changed
        self.traced_once: list[str] = []  # layer classes Dynamo traces once (passkit.regions.traced_once)

    @property
    def pipeline(self) -> Any:
        if self._pipeline is None:
            self._pipeline = resolve_pipeline(self._pipeline_arg, self._settings)
        return self._pipeline

    def pipeline_for(self, mode: str | None = None, options: dict[str, Any] | None = None) -> Any:
        """The pipeline for one ``torch.compile(mode=..., options=...)`` combination."""
        if not mode and not options:
            return self.pipeline
        key = (mode, repr(sorted((options or {}).items())))
        if key not in self._variants:
            pipeline_arg, settings = split_options(options, list(type(self.pipeline.settings).model_fields))
            base = (
                self.pipeline
                if pipeline_arg is None and not settings
                else resolve_pipeline(pipeline_arg or self._pipeline_arg, {**self._settings, **settings})
            )
            self._variants[key] = apply_mode(base, mode)
        return self._variants[key]

    def __call__(
        self,
        gm: GraphModule,
        example_inputs: Sequence[Any],
        mode: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> Callable[..., Any]:
        warn_at_recompile_limit()
        _torch.on_dynamo_frame_start(_announce_tracing)  # again: torch._dynamo.reset() drops it
        try:
            pipeline = self.pipeline_for(mode, options)
        except Exception as exc:  # noqa: BLE001 - a bad pipeline or option is passkit's one-line error
            return raise_when_called(exc)
        self._announce(gm, example_inputs)
        try:
            refuse_regions_reading_other_layers(gm)
        except StampedRegionError as exc:  # Dynamo's graph is wrong: running it eagerly is no fallback
            return raise_when_called(exc)
        fallback = Fallback(pipeline, self.fallbacks)
        try:
            if limited_steps(pipeline):
                return self.saved_ledger.compile(
                    _torch.current_frame_id(), gm, list(example_inputs), pipeline, self._compile_graph
                )
            return self._compile_graph(gm, list(example_inputs), pipeline)[0]
        except Exception as exc:  # noqa: BLE001 - every failure goes through on_error
            try:
                return fallback.handle(exc, gm.forward)
            except Exception as final:  # noqa: BLE001
                return raise_when_called(final)

    def _announce(self, gm: GraphModule, example_inputs: Sequence[Any]) -> None:
        """Say which graph is about to be captured, and for a recompile what changed."""
        try:
            event = self.announcer.event(gm, example_inputs, len(self.reports) + 1)
        except Exception as exc:  # noqa: BLE001 - a progress line must never cost the compile
            log.debug("passkit: cannot describe the graph being compiled: %s", exc)
            return
        send(self.progress, event)

    def _compile_graph(self, gm: GraphModule, inputs: Sequence[Any], pipeline: Any) -> tuple[Callable[..., Any], Report]:
        merged = merge_written_views(gm, inputs)
        if merged is not None:
            compiled, report = self._compile_graph(merged.gm, merged.inputs, pipeline)
            return merged.bind(compiled, gm.forward), report
        # An optimizer's parameters and state reach the graph as attributes; as inputs, their
        # updates are recorded and written back in place like any mutated input's.
        gm, lifted = lift_attributes(gm)
        inputs = [*lifted.tensors, *inputs]
        kinds = [*lifted.kinds, *[None] * (len(inputs) - len(lifted.kinds))] if lifted.tensors else None
        flat = flatten_subclasses(gm, inputs, kinds)  # the first stage: passes see plain tensors only
        if flat is None:
            program = program_from_graph(gm, inputs, kinds=kinds)
        else:
            program = program_from_flat_graph(flat, gm)
            inputs = flat.inputs
        if self.traced_once:
            program.notes[TRACED_ONCE_NOTE] = list(self.traced_once)
        self.programs.append(program)
        compiled = compile_program(program, inputs, pipeline, reports=self.reports, progress=self.progress)
        return lifted.bind(with_subclasses(compiled, program)), self.reports[-1]


def _announce_tracing(backend: Any, where: str, compile_id: str) -> None:
    """Dynamo started tracing a frame: for a passkit backend, say so before the seconds it takes."""
    if backend is dynamo_backend:  # torch.compile(backend="passkit")
        backend = _default_backend()
    if isinstance(backend, PasskitBackend):
        frame = f" (Dynamo frame {compile_id})" if compile_id else ""
        send(backend.progress, ProgressEvent(kind="tracing", text=f"Dynamo is tracing {where}{frame}"))


# ``torch.compile(backend="passkit")`` imports this module when it looks the entry point up,
# before Dynamo traces the first frame: installing here gives that frame its tracing line too.
_torch.on_dynamo_frame_start(_announce_tracing)


def backend(pipeline: Any = DEFAULT_PIPELINE, **settings: Any) -> PasskitBackend:
    """A ``torch.compile`` backend running ``pipeline`` (a name, a ``.toml`` path, a dict with a
    pipeline file's keys, or a Pipeline).

    The pipeline is loaded and validated now, so a bad file fails here, not at the first call.
    """
    compiled_backend = PasskitBackend(pipeline, **settings)
    _prepare_steps(compiled_backend.pipeline)
    return compiled_backend


_prepared: set[int] = set()


def _prepare_steps(pipeline: Any) -> None:
    """Run each step's ``prepare`` once per process, before any graph reaches the backend."""
    for step in pipeline.steps:
        prepare = step.pass_.prepare
        if prepare is not None and id(prepare) not in _prepared:
            prepare()
            _prepared.add(id(prepare))


def _trace_once_step(pipeline: Any) -> Any:
    """The enabled ``regions`` step with ``trace_once`` on, if the pipeline has one."""
    for step in pipeline.steps:
        if step.pass_.name == "regions" and step.enabled and getattr(step.options, "trace_once", False):
            return step
    return None


def dynamo_backend(gm: GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable[..., Any]:
    """``torch.compile(m, backend="passkit", mode=..., options=...)``: the default pipeline."""
    return _default_backend()(gm, example_inputs, **kwargs)


_DEFAULT: list[PasskitBackend] = []


def _default_backend() -> PasskitBackend:
    if not _DEFAULT:
        _DEFAULT.append(PasskitBackend(DEFAULT_PIPELINE))
    return _DEFAULT[0]


def compile(
    model_or_fn: Any,
    pipeline: Any = DEFAULT_PIPELINE,
    *,
    dynamic: bool | None = None,
    progress: Progress | None = None,
    **settings: Any,
) -> Any:
    """Compile a module or function through Dynamo with ``pipeline``.

    ``dynamic`` means what it means to ``torch.compile``: ``None`` compiles the first shapes
    statically and recompiles once with symbolic sizes for those that change; ``True`` makes
    sizes symbolic from the start; ``False`` compiles every new shape. The result has
    ``passkit_reports``: one ``Report`` per graph Dynamo captured, and
    ``passkit_fallbacks``: the reason of each compile that fell back to eager
    (``on_error = "eager"``). ``progress`` receives each step's ``StepRecord`` as it finishes
    (default: INFO lines on the ``passkit`` logger), and its ``event`` method, if it has one,
    each ``passkit.core.progress.ProgressEvent`` (a graph compiling or recompiling, a long step
    started, a heartbeat); ``settings`` override the pipeline's.
    """
    compiled_backend = PasskitBackend(pipeline, progress=progress, **settings)
    _prepare_steps(compiled_backend.pipeline)  # validate the file now, not at the first call
    compiled = _torch.under_passkits_dynamo_settings(torch.compile(model_or_fn, backend=compiled_backend, dynamic=dynamic))
    regions_step = _trace_once_step(compiled_backend.pipeline)
    if regions_step is not None and isinstance(model_or_fn, torch.nn.Module):
        compiled_backend.traced_once = tracing_each_layer_once(compiled, model_or_fn, regions_step.options.min_repeats,
                                                               lambda: bool(compiled_backend.reports))
    compiled.passkit_reports = compiled_backend.reports
    compiled.passkit_fallbacks = compiled_backend.fallbacks
    compiled.passkit_backend = compiled_backend
    return compiled
