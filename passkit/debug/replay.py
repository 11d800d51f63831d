"""Own replaying a reproducer: run its failing step again, without the user's model or source.

``replay`` reads the folder ``passkit.artifacts.reproducer`` wrote, loads the program as it was before
the step and the resolved pipeline, and runs the one step with the pipeline's ``verify``
setting; numerics are compared with the program as it was before the step, on the saved inputs
(or seeded values of the recorded shapes). It reproduces when the step fails the same way
(``crash``, ``fact`` or ``numerics``) as recorded. Version differences are reported, not fatal.

The program is a pickle, so a folder (or pickle) that the group or others can write, or that
another user owns, is refused in one line before anything is loaded
(``passkit.core.private_folders``). The replay writes nothing outside the folder: no report, no
dumps, no reproducer of its own.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from passkit.artifacts.program_file import RECORD, TensorMeta, read_program
from passkit.artifacts.reproducer import FORMAT, MANIFEST, WHAT, failure_kind, versions
from passkit.core.private_folders import refusal
from passkit.errors import PasskitError, PassError, PipelineError, VerificationError

if TYPE_CHECKING:
    import pluggy

    from passkit.core.program import Program
    from passkit.core.registry import Registry
    from passkit.pipeline import Pipeline

__all__ = ["Replay", "read_manifest", "reproducer_pipeline", "real_inputs", "replay"]


@dataclass
class Replay:
    """What replaying a reproducer showed."""

    folder: str
    label: str
    recorded_kind: str
    recorded_message: str
    kind: str | None  # None: the step ran cleanly
    message: str
    version_notes: list[str]
    tolerance: str = ""  # what numerics were held to (``rtol 0.001, atol 0.0001``); empty without numerics

    @property
    def reproduced(self) -> bool:
        return self.kind == self.recorded_kind

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "reproduced": self.reproduced}


def read_manifest(folder: Path) -> dict[str, Any]:
    """The reproducer's manifest; a one-line error when ``folder`` is not a reproducer, or is not
    private to the user."""
    for found in (folder, folder / RECORD):
        reason = refusal(found, WHAT if found == folder else "reproducer file")
        if reason is not None:
            raise PasskitError(reason)
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PasskitError(f"{folder}: not a passkit reproducer (no {MANIFEST})") from None
    except (OSError, ValueError) as exc:
        raise PasskitError(f"{path}: cannot read: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise PasskitError(f"{path}: reproducer format {manifest.get('format')!r}, this passkit reads {FORMAT}")
    if not manifest.get("replayable"):
        raise PasskitError(f"{folder}: cannot replay: {manifest.get('not_replayable_because')}")
    return manifest


def reproducer_pipeline(folder: Path, manifest: dict[str, Any], registry: Registry) -> Pipeline:
    """The reproducer's ``pipeline.toml``, loaded with ``registry``. When the failing step's pass
    is not registered, the one-line error names the module the reproducer recorded it from and
    the ``--plugin`` option that registers it."""
    from passkit.pipeline import load_pipeline

    step = manifest.get("step", {})
    name, module = step.get("pass"), step.get("module")
    if name and name not in registry.passes:
        where = f" from module {module!r}" + (f" ({step['distribution']})" if step.get("distribution") else "") if module else ""
        fix = f"install its plugin, or name the module with --plugin {module}" if module else "install its plugin, or name it with --plugin MODULE"
        raise PipelineError(f"{folder}: the failing step's pass {name!r} is not registered; the reproducer recorded it{where}: {fix}")
    try:
        return load_pipeline(folder / "pipeline.toml", registry=registry)
    except PipelineError as exc:
        if "unknown pass" not in str(exc):
            raise
        raise PipelineError(f"{exc}; a plugin that is not installed can be named with --plugin MODULE") from None


def _version_notes(recorded: dict[str, Any]) -> list[str]:
    now = versions()
    notes = [
        f"{key} {recorded.get(key)} recorded, {now[key]} installed"
        for key in ("torch", "passkit")
        if recorded.get(key) != now[key]
    ]
    for name, version in recorded.get("plugins", {}).items():
        if now["plugins"].get(name) != version:
            notes.append(f"plugin {name!r} {version} recorded, {now['plugins'].get(name, 'not installed')} installed")
    return notes


def real_inputs(folder: Path, program: Program) -> list[Any]:
    """The saved input values, else seeded values of the recorded shapes and dtypes."""
    saved = folder / "inputs.pt"
    if saved.is_file():
        # Saved where they lived; a machine without CUDA still replays a CPU-only failure.
        return torch.load(saved, weights_only=True, map_location=None if torch.cuda.is_available() else "cpu")
    return [TensorMeta.of(x).real(seed=i) if isinstance(x, torch.Tensor) else x for i, x in enumerate(program.example_inputs)]


def replay(folder: Path, *, pm: pluggy.PluginManager, registry: Registry) -> Replay:
    """Run the reproducer's failing step again on its saved program."""
    from passkit.verify.compare import tolerance_for
    from passkit.verify.evaluate import Reference
    from passkit.core.runner import run_pipeline

    manifest = read_manifest(folder)
    recorded = manifest["step"]
    pipeline = reproducer_pipeline(folder, manifest, registry)
    position = recorded["position"]
    if position >= len(pipeline.steps) or pipeline.steps[position].id != recorded["id"]:
        raise PipelineError(f"{folder / 'pipeline.toml'}: has no step {recorded['id']!r} at position {position}")
    step = pipeline.steps[position]
    notes = _version_notes(manifest.get("versions", {}))
    if step.pass_.fingerprint() != recorded["fingerprint"]:
        notes.append(f"pass {step.pass_name} is {step.pass_.fingerprint()}, the reproducer recorded {recorded['fingerprint']}")
    program = read_program(folder, registry)
    verify = manifest["verify"]
    reference = Reference(program, real_inputs(folder, program)) if verify == "numerics" else None
    # Settings that write files are the failing run's: replaying must not overwrite its report.
    one_step = dataclasses.replace(pipeline, steps=(step,)).with_settings(dump="off", repro_dir="", report="")
    kind, message = None, ""
    try:
        run_pipeline(one_step, program, pm=pm, registry=registry, reference=reference)
    except (PassError, VerificationError) as exc:
        cause = exc.__cause__ if isinstance(exc, PassError) and exc.__cause__ is not None else exc
        kind, message = failure_kind(cause), str(exc).strip().splitlines()[0]
    tolerance = str(tolerance_for(one_step.settings, [step])) if reference is not None else ""
    return Replay(
        folder=str(folder),
        label=pipeline.where(step),
        recorded_kind=manifest["failure"]["kind"],
        recorded_message=manifest["failure"]["message"],
        kind=kind,
        message=message,
        version_notes=notes,
        tolerance=tolerance,
    )
