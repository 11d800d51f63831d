"""Own what every way in shares: loading a pipeline, compiling a captured ``Program``, falling
back to eager.

Each entry captures a ``Program`` (through Dynamo in ``passkit.frontends.api``; by tracing with
``make_fx`` in ``passkit.frontends.aot``), runs the pipeline over it, and wraps the compiled
graphs in the runtime wrapper. ``on_error = "eager"`` turns any compile failure into one warning
(attributed to the user's call) and the uncompiled callable; the reasons are kept in the
result's ``passkit_fallbacks``.

Progress: ``progress=`` takes a callable that receives each step's ``StepRecord`` as the step
finishes; without one, each step is logged at INFO level on the ``passkit`` logger
(``logging.basicConfig(level=logging.INFO)`` shows them), and a compile cache hit is one line
(``report.summary_line``), since no step ran. A callback with a ``loaded_from_cache`` method
gets a hit's stored ``Report`` there instead of its records. A step running over a second gets
``started`` and heartbeat lines (``passkit.progress``): they are logged too, or a callback with
an ``event`` method receives them as ``ProgressEvent`` events. Compiled programs go through the
on-disk compile cache (``passkit.cache.store``) unless ``cache = "off"``.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Sequence

from passkit import _torch
from passkit.autodiff.subclasses import CAPTURED_SOURCE, CAPTURED_SOURCE_UNCACHED
from passkit.core.program import Program
from passkit.core.progress import log_event
from passkit.core.report import Report, StepRecord, summary_line
from passkit.errors import PasskitError
from passkit.frontends.compile_options import record_report
from passkit.frontends.user_warnings import warn_at_user_code
from passkit.runtime.wrapper import CompiledProgram

__all__ = [
    "DEFAULT_PIPELINE", "Fallback", "Progress", "compile_program", "load_pipeline", "raise_when_called", "resolve_pipeline",
    "run_steps",
]

DEFAULT_PIPELINE = "training"
Progress = Callable[[StepRecord], None]
log = logging.getLogger("passkit")


def _log_progress(total: int) -> Progress:
    """The default progress: one INFO line per finished step, numbered like the report table,
    and one per progress event (``passkit.core.progress``)."""

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


def load_pipeline(spec: Any) -> Any:
    """Load and validate a pipeline (a name, a ``.toml`` path, a dict with a pipeline file's
    keys whose steps may name ``Pass`` objects, or a ``Pipeline``) against the process-wide
    plugins. Every way in resolves its pipeline here or in ``resolve_pipeline``.

    Raises:
        PipelineError: one line, starting with the file that holds the mistake (for a dict, the
            Python line that handed it over: ``nb.py:12``).
    """
    from passkit.pipeline import load_pipeline as load
    from passkit.core.registry import get_registry

    return load(spec, registry=get_registry())


def _argument(pipeline: Any, resolved: Any) -> str:
    """How the user named the pipeline: their string or path, else the loaded pipeline's name."""
    return str(pipeline) if isinstance(pipeline, (str, os.PathLike)) else resolved.name


def resolve_pipeline(pipeline: Any, settings: dict[str, Any]) -> Any:
    """The loaded pipeline (any form ``load_pipeline`` takes) with ``settings`` applied; a mounted
    file is refused, since its steps run inside Inductor's slots, and so is an export pipeline,
    which makes no code to call."""
    resolved = load_pipeline(pipeline)
    if resolved.mounted:  # its steps run in Inductor's slots, around torch's own stages
        raise PasskitError(
            f"{resolved.label}: the file mounts its steps in Inductor's slots; "
            f"use torch.compile(model, options=passkit.inductor_options({_argument(pipeline, resolved)!r}))"
        )
    if resolved.kind == "export":
        raise PasskitError(
            f'{resolved.label}: an export pipeline (kind = "export") makes an ExportedProgram, not code to call; '
            f"use passkit.export(model, args, pipeline={_argument(pipeline, resolved)!r}), or a pipeline that compiles, such as 'training'"
        )
    return resolved.with_settings(**settings) if settings else resolved


def _missing_training_steps(pipeline: Any, program: Program) -> str | None:
    # ``label`` only in the messages: it resolves the file's path, and every compile asks.
    if program.training and "partitioned" not in program.facts:
        return (
            f"{pipeline.label}: the program needs gradients but the pipeline has no 'joint' and 'partition' steps; "
            "use the 'training' pipeline, or call it under torch.no_grad()"
        )
    if "compiled" not in program.facts:
        return f"{pipeline.label}: the pipeline left no compiled callables; end it with a codegen step"
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
    run_steps(program, real_inputs, pipeline, reports=reports, progress=progress)
    problem = _missing_training_steps(pipeline, program)
    if problem:
        raise PasskitError(problem)
    return CompiledProgram(program, compiled_by=_codegen_step(pipeline))


def run_steps(
    program: Program, real_inputs: list[Any], pipeline: Any, *, reports: list[Report] | None = None,
    progress: Progress | None = None,
) -> Report:
    """Run ``pipeline``'s steps over ``program`` in place, or fill it from the compile cache, and
    return the report (kept for ``passkit.reports()`` and in ``reports``). ``real_inputs`` are
    what ``verify = "numerics"`` compares the captured program on."""
    from passkit.cache.store import CompileCache, cache_enabled
    from passkit.core.plugins import get_plugin_manager
    from passkit.core.registry import get_registry
    from passkit.core.runner import run_pipeline
    from passkit.verify.evaluate import Reference

    pm = get_plugin_manager()
    progress = progress or _log_progress(len(pipeline.steps))
    # A notebook's pass reading a value passkit cannot hash: compiled every time, and the report says why.
    refusal = pipeline.cache_refusal() if cache_enabled(pipeline) else None
    if refusal is None and cache_enabled(pipeline) and CAPTURED_SOURCE in program.notes:
        refusal = CAPTURED_SOURCE_UNCACHED
    cache = None if refusal else CompileCache.for_compile(pipeline, program, plugins=[name for name, _ in pm.list_name_plugin()])
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
        if cache is not None and cache.readable:
            report.cache = "miss"  # looked up, not found: the steps ran
        if refusal:
            log.info("passkit: not caching: %s", refusal)
            report.uncached = refusal
        complete = pipeline.kind == "export" or _missing_training_steps(pipeline, program) is None
        if cache is not None and complete:
            cache.store(program, report)
    record_report(report)
    finished = getattr(progress, "finished", None)
    if callable(finished):
        finished(report)
    if reports is not None:
        report.graph = f"graph {len(reports) + 1}, {'training' if program.training else 'inference'}"
        reports.append(report)
    return report


def _codegen_step(pipeline: Any) -> str:
    """Where the program's code came from: the last enabled step that compiles graphs."""
    steps = [step for step in pipeline.steps if step.enabled and "compiled" in step.pass_.produces]
    return pipeline.where(steps[-1]) if steps else pipeline.label


class Fallback:
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


def raise_when_called(exc: Exception) -> Callable[..., Any]:
    """Dynamo wraps backend exceptions in its own; raising at call time keeps ours one line."""

    def raiser(*args: Any) -> Any:
        raise exc

    return raiser
