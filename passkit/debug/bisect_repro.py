"""Own bisecting from a reproducer folder, in place of the user's model.

A reproducer (``passkit.artifacts.reproducer``) holds the program as it was before its failing step,
the resolved pipeline and the input values (or their metadata). Bisecting it searches the
failing step and the steps after it (the ones before it had already run on that program), and
compares with what the program computed before the failing step, on the saved inputs, as
``passkit repro`` does. Without the user's model or source, on another machine too.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from passkit.debug.bisect import Bisection, bisect_program
from passkit.debug.bisect_model import Captured
from passkit.debug.replay import read_manifest, real_inputs, reproducer_pipeline
from passkit.artifacts.snapshot import snapshot_program
from passkit.errors import PasskitError, PipelineError

if TYPE_CHECKING:
    import pluggy

    from passkit.pipeline import Pipeline
    from passkit.core.registry import Registry

__all__ = ["load_reproducer", "bisect_reproducer"]


def load_reproducer(folder: Path, *, registry: Registry) -> tuple[Pipeline, Captured, int]:
    """The reproducer's resolved pipeline, its program with what it computes, and the position
    of its failing step; a one-line ``PasskitError`` when ``folder`` is not a usable reproducer."""
    from passkit.artifacts.program_file import read_program
    from passkit.verify.evaluate import Reference

    if not folder.is_dir():
        raise PasskitError(f"{folder}: not a passkit reproducer (no such folder)")
    manifest = read_manifest(folder)
    step = manifest.get("step", {})
    pipeline = reproducer_pipeline(folder, manifest, registry)
    position = step.get("position")
    if not isinstance(position, int) or position >= len(pipeline.steps) or pipeline.steps[position].id != step.get("id"):
        raise PipelineError(f"{folder / 'pipeline.toml'}: has no step {step.get('id')!r} at position {position}")
    program = read_program(folder, registry)
    label = f"reproducer {folder.name}, {'training' if program.training else 'inference'}"
    captured = Captured(label, snapshot_program(program), Reference(program, real_inputs(folder, program)))
    return pipeline, captured, position


def bisect_reproducer(
    folder: Path,
    *,
    pm: pluggy.PluginManager,
    registry: Registry,
    progress: Callable[[str], None] | None = None,
) -> tuple[Pipeline, Bisection, Captured]:
    """Bisect the reproducer's failing step and the steps after it on its saved program."""
    pipeline, captured, position = load_reproducer(folder, registry=registry)
    result = bisect_program(
        captured.program, captured.reference, pipeline, pm=pm, registry=registry,
        graph=captured.label, progress=progress, start=position,
    )
    return pipeline, result, captured
