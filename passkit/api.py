"""Own the public entry points through Dynamo (``compile``, ``backend``) and what every entry
shares: loading a pipeline, compiling a captured ``Program``, falling back to eager.

Each entry captures a ``Program`` (through Dynamo here; by tracing with ``make_fx`` in
``passkit.aot``), runs the pipeline over it, and wraps the compiled graphs in the runtime
wrapper. ``on_error = "eager"`` turns any compile failure into one warning (attributed to the
user's call) and the uncompiled callable; the reasons are kept in the result's
``passkit_fallbacks``.

Progress: ``progress=`` takes a callable that receives each step's ``StepRecord`` as the step
finishes; without one, each step is logged at INFO level on the ``passkit`` logger
(``logging.basicConfig(level=logging.INFO)`` shows them), and a compile cache hit is one line
(``report.summary_line``), since no step ran. A callback with a ``loaded_from_cache`` method
gets a hit's stored ``Report`` there instead of its records. A frame Dynamo starts tracing for
passkit says so (``tracing``); each graph Dynamo hands over opens with a
``compiling``/``recompiling`` line (``passkit.recompiles``); and a step running over a
second gets ``started`` and heartbeat lines (``passkit.progress``): they are logged too, or a
callback with an ``event`` method receives them as ``ProgressEvent`` events. Compiled programs go through the
on-disk compile cache (``passkit.cache``) unless ``cache = "off"``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Sequence

import torch
from torch.fx import GraphModule

from passkit import _torch
from passkit.capture import program_from_flat_graph, program_from_graph
from passkit.compile_options import apply_mode, record_report, split_options, warn_at_recompile_limit
from passkit.errors import PasskitError
from passkit.graph_attributes import lift_attributes
from passkit.passes.regions import TRACED_ONCE_NOTE
from passkit.program import Program
from passkit.progress import ProgressEvent, log_event, send
from passkit.recompiles import CompileAnnouncer
from passkit.report import Report, StepRecord, summary_line
from passkit.runtime import CompiledProgram
from passkit.saved_limit import SavedLedger, limited_steps
from passkit.stamped_regions import StampedRegionError, refuse_regions_reading_other_layers
from passkit.subclasses import flatten_subclasses, with_subclasses
from passkit.traced_once import tracing_each_layer_once
from passkit.user_warnings import warn_at_user_code

__all__ = [
    "compile",
    "backend",
    "dynamo_backend",
    "compile_program",
    "load_pipeline",
]

DEFAULT_PIPELINE = "training"
Progress = Callable[[StepRecord], None]
log = logging.getLogger("passkit")


def _log_progress(total: int) -> Progress:
    """The default progress: one INFO line per finished step, numbered like the report table,
    and one per progress event (``passkit.progress``)."""

    def report(record: StepRecord) -> None:
        if record.status == "skipped":
            log.info("[%d/%d] %s: skipped (%s)", record.position + 1, total, record.id, record.reason)
        else:
            log.info(
                "[%d/%d] %s: %s, %.1f ms, %d->%d nodes", record.position + 1, total, record.id,
                "changed" if record.changed else "unchanged", record.seconds * 1000, record.nodes_before, record.nodes_after,
            )

    def loaded_from_cache(stored: Report) -> None:
        # No step ran in this process: replaying the stored records would log the compiling
        # process's step times as if they were this run's.
        log.info("%s", summary_line(stored))

    report.event = log_event  # type: ignore[attr-defined]  # long steps' started and heartbeat lines too
    report.loaded_from_cache = loaded_from_cache  # type: ignore[attr-defined]
    return report


def load_pipeline(name_or_path: Any) -> Any:
    """Load and validate a pipeline (a name, a ``.toml`` path, or a ``Pipeline``) against the
    process-wide plugins.

    Raises:
        PipelineError: one line, starting with the file that holds the mistake.
    """
    from passkit.pipeline import load_pipeline as load
    from passkit.registry import get_registry

    return load(name_or_path, registry=get_registry())


def _argument(pipeline: Any, resolved: Any) -> str:
    """How the user named the pipeline: their string or path, else the loaded pipeline's name."""
    return str(pipeline) if isinstance(pipeline, (str, os.PathLike)) else resolved.name


def _resolve(pipeline: Any, settings: dict[str, Any]) -> Any:
    resolved = load_pipeline(pipeline)
    if resolved.mounted:  # its steps run in Inductor's slots, around torch's own stages
        raise PasskitError(
            f"{resolved.label}: the file mounts its steps in Inductor's slots; "
            f"use torch.compile(model, options=passkit.inductor_options({_argument(pipeline, resolved)!r}))"
        )
    return resolved.with_settings(**settings) if settings else resolved


def _missing_training_steps(pipeline: Any, program: Program) -> str | None:
    label = pipeline.label
    if program.training and "partitioned" not in program.facts:
        return (
            f"{label}: the program needs gradients but the pipeline has no 'joint' and 'partition' steps; "
            "use the 'training' pipeline, or call it under torch.no_grad()"
        )
    if "compiled" not in program.facts:
        return f"{label}: the pipeline left no compiled callables; end it with a codegen step"
    return None


def compile_program(
    program: Program,
    real_inputs: Sequence[Any],
    pipeline: Any,
    *,
    reports: list[Report] | None = None,
    progress: Progress | None = None,
) -> CompiledProgram:
    """Run ``pipeline`` over a captured program (or load it from the compile cache) and wrap
    the result for calling. ``progress`` gets each step's record; by default they are logged.

    The user's saved-tensor hooks stay out of the traces; they run around the compiled program.
    """
    with _torch.saved_tensors_hooks_deferred():
        return _compile_program(program, [_torch.concrete(x) for x in real_inputs], pipeline, reports, progress)


def _compile_program(
    program: Program, real_inputs: list[Any], pipeline: Any, reports: list[Report] | None, progress: Progress | None
) -> CompiledProgram:
    from passkit.cache import CompileCache
    from passkit.evaluate import Reference
    from passkit.plugins import get_plugin_manager
    from passkit.registry import get_registry
    from passkit.runner import run_pipeline

    pm = get_plugin_manager()
    progress = progress or _log_progress(len(pipeline.steps))
    cache = CompileCache.for_compile(pipeline, program, plugins=[name for name, _ in pm.list_name_plugin()])
    if "subclasses" in program.notes:
        cache = None  # the key sees the flat graph, not the subclass layouts its joint depends on
    captured = dict(program.graphs)
    report = cache.load(program) if cache is not None else None
    if report is not None:
        pm.hook.passkit_loaded_from_cache(pipeline=pipeline, program=program, report=report, captured=captured)
        loaded = getattr(progress, "loaded_from_cache", None)
        if callable(loaded):
            loaded(report)
        else:  # a callback that knows nothing of hits still sees every step's stored record
            for record in report.records:
                progress(record)
    else:
        reference = Reference(program, real_inputs) if pipeline.settings.verify == "numerics" else None
        report = run_pipeline(pipeline, program, pm=pm, registry=get_registry(), reference=reference, progress=progress)
        if cache is not None and _missing_training_steps(pipeline, program) is None:
            cache.store(program, report)
    record_report(report)
    finished = getattr(progress, "finished", None)
    if callable(finished):
        finished(report)
    if reports is not None:
        report.graph = f"graph {len(reports) + 1}, {'training' if program.training else 'inference'}"
        reports.append(report)
    problem = _missing_training_steps(pipeline, program)
    if problem:
        raise PasskitError(problem)
    return CompiledProgram(program, compiled_by=_codegen_step(pipeline))


def _codegen_step(pipeline: Any) -> str:
    """Where the program's code came from: the last enabled step that compiles graphs."""
    steps = [step for step in pipeline.steps if step.enabled and "compiled" in step.pass_.produces]
    return pipeline.where(steps[-1]) if steps else pipeline.label


class _Fallback:
    """Decide what a failed compile turns into: a raise at call time, or eager with one warning.

    Each fallback's one-line reason is appended to ``reasons`` (the result's ``passkit_fallbacks``).
    """

    def __init__(self, pipeline: Any, reasons: list[str] | None = None) -> None:
        self.pipeline = pipeline
        self.warned = False
        self.reasons = reasons if reasons is not None else []

    def handle(self, exc: Exception, eager: Callable[..., Any]) -> Callable[..., Any]:
        if self.pipeline.settings.on_error != "eager":
            raise exc
        lines = str(exc).strip().splitlines()
        self.reasons.append(lines[0] if lines else type(exc).__name__)
        if not self.warned:
            self.warned = True
            warn_at_user_code(f"passkit: compiling failed, running eagerly: {exc}")
        return eager


def _raise_when_called(exc: Exception) -> Callable[..., Any]:
    """Dynamo wraps backend exceptions in its own; raising at call time keeps ours one line."""

    def raiser(*args: Any) -> Any:
        raise exc

    return raiser


class PasskitBackend:
    """A ``torch.compile`` backend that runs one pipeline; keeps one report per graph.

    ``torch.compile``'s ``mode`` and ``options`` arrive as keyword arguments (see
    ``passkit.compile_options``); each distinct pair resolves its pipeline once.
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
        self.traced_once: list[str] = []  # layer classes Dynamo traces once (passkit.traced_once)

    @property
    def pipeline(self) -> Any:
        if self._pipeline is None:
            self._pipeline = _resolve(self._pipeline_arg, self._settings)
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
                else _resolve(pipeline_arg or self._pipeline_arg, {**self._settings, **settings})
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
            return _raise_when_called(exc)
        self._announce(gm, example_inputs)
        try:
            refuse_regions_reading_other_layers(gm)
        except StampedRegionError as exc:  # Dynamo's graph is wrong: running it eagerly is no fallback
            return _raise_when_called(exc)
        fallback = _Fallback(pipeline, self.fallbacks)
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
                return _raise_when_called(final)

    def _announce(self, gm: GraphModule, example_inputs: Sequence[Any]) -> None:
        """Say which graph is about to be captured, and for a recompile what changed."""
        try:
            event = self.announcer.event(gm, example_inputs, len(self.reports) + 1)
        except Exception as exc:  # noqa: BLE001 - a progress line must never cost the compile
            log.debug("passkit: cannot describe the graph being compiled: %s", exc)
            return
        send(self.progress, event)

    def _compile_graph(self, gm: GraphModule, inputs: Sequence[Any], pipeline: Any) -> tuple[Callable[..., Any], Report]:
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
    """A ``torch.compile`` backend running ``pipeline`` (a name, a ``.toml`` path or a Pipeline).

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
    each ``passkit.progress.ProgressEvent`` (a graph compiling or recompiling, a long step
    started, a heartbeat); ``settings`` override the pipeline's.
    """
    compiled_backend = PasskitBackend(pipeline, progress=progress, **settings)
    _prepare_steps(compiled_backend.pipeline)  # validate the file now, not at the first call
    compiled = torch.compile(model_or_fn, backend=compiled_backend, dynamic=dynamic)
    regions_step = _trace_once_step(compiled_backend.pipeline)
    if regions_step is not None and isinstance(model_or_fn, torch.nn.Module):
        compiled_backend.traced_once = tracing_each_layer_once(compiled, model_or_fn, regions_step.options.min_repeats,
                                                               lambda: bool(compiled_backend.reports))
    compiled.passkit_reports = compiled_backend.reports
    compiled.passkit_fallbacks = compiled_backend.fallbacks
    compiled.passkit_backend = compiled_backend
    return compiled
