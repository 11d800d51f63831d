"""Own reproducers: a folder that replays one failing step without the user's model or source.

``write_reproducer`` is called by the ``repro`` instrument when a step raises, breaks a fact or
changes numerics. The folder (``<repro_dir>/NN-<step id>``, never an existing one) holds:

- ``manifest.json``: the failing step (1-based number, position, id, pass and its
  fingerprint), the failure (kind and one-line message), the steps before it, and the installed
  versions of Python, torch, passkit and every plugin;
- ``pipeline.toml``: the resolved pipeline, self-contained (``passkit.debug.pipeline_file``);
- the program as it was before the step (``passkit.debug.program_file``): ``graphs/*.py``,
  ``program.json`` (signature, facts, input metadata) and the replayable ``program.pkl``;
- ``inputs.pt``: the real input values, when they are known (``verify = "numerics"``) and
  under ``MAX_INPUT_BYTES`` in all.

``replay`` loads the program and runs the one step again, with the pipeline's ``verify``
setting; numerics are compared with the program as it was before the step. It reproduces when
the step fails the same way (``crash``, ``fact`` or ``numerics``) as recorded.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from passkit.debug.pipeline_file import pipeline_toml
from passkit.debug.program_file import TensorMeta, read_program, write_program
from passkit.errors import PasskitError, PassError, PipelineError, VerificationError

if TYPE_CHECKING:
    import pluggy

    from passkit.hookspecs import StepContext
    from passkit.program import Program
    from passkit.registry import Registry

__all__ = ["MAX_INPUT_BYTES", "MANIFEST", "failure_kind", "write_reproducer", "Replay", "replay"]

MAX_INPUT_BYTES = 64 * 2**20
MANIFEST = "manifest.json"
FORMAT = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def failure_kind(exc: BaseException) -> str:
    """``numerics``, ``fact`` (a broken fact) or ``crash`` (the pass raised)."""
    if isinstance(exc, VerificationError):
        return "numerics" if " changed numerics: " in str(exc) else "fact"
    return "crash"


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    if isinstance(exc, VerificationError):
        return lines[0] if lines else ""
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _unique_folder(root: Path, stem: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    candidate, n = root / stem, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            n += 1
            candidate = root / f"{stem}-{n}"


def versions() -> dict[str, Any]:
    """Python, torch, passkit and each registered plugin's distribution and version."""
    from passkit import __version__
    from passkit.plugins import get_plugin_manager

    pm = get_plugin_manager()
    plugins = {name: f"{dist} {version}".strip() for name, (dist, version) in sorted(pm.distributions.items())}
    try:
        passkit_version = importlib.metadata.version("passkit")
    except importlib.metadata.PackageNotFoundError:
        passkit_version = __version__
    return {"python": platform.python_version(), "torch": torch.__version__, "passkit": passkit_version, "plugins": plugins}


def _input_values(real_inputs: list[Any] | None) -> list[Any] | None:
    if real_inputs is None:
        return None
    size = sum(x.numel() * x.element_size() for x in real_inputs if isinstance(x, torch.Tensor))
    if size > MAX_INPUT_BYTES:
        return None
    return [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in real_inputs]


def write_reproducer(context: StepContext, before: Program, exc: BaseException) -> Path:
    """Write the reproducer for ``context``'s step, which raised ``exc`` on ``before``."""
    step, pipeline = context.step, context.pipeline
    number = step.position + 1
    folder = _unique_folder(Path(pipeline.settings.repro_dir), f"{number:02d}-{_UNSAFE.sub('_', step.id)}")
    unportable = write_program(before, folder, header=f"before step {number} ({step.id}) of {pipeline.label}")
    reference = context.reference
    values = _input_values(getattr(reference, "real_inputs", None))
    if values is not None:
        torch.save(values, folder / "inputs.pt")
    (folder / "pipeline.toml").write_text(
        pipeline_toml(pipeline, comment=f"resolved from {pipeline.label} by a passkit reproducer"), encoding="utf-8"
    )
    manifest = {
        "format": FORMAT,
        "step": {
            "number": number,
            "position": step.position,
            "id": step.id,
            "pass": step.pass_name,
            "fingerprint": step.pass_.fingerprint(),
            "label": context.label,
        },
        "failure": {"kind": failure_kind(exc), "message": _one_line(exc)},
        "previous": list(context.previous),
        "verify": pipeline.settings.verify,
        "replayable": unportable is None,
        "not_replayable_because": unportable,
        "input_values": "inputs.pt" if values is not None else None,
        "versions": versions(),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return folder


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

    @property
    def reproduced(self) -> bool:
        return self.kind == self.recorded_kind

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "reproduced": self.reproduced}


def read_manifest(folder: Path) -> dict[str, Any]:
    """The reproducer's manifest; a one-line error when ``folder`` is not a reproducer."""
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
    from passkit.evaluate import Reference
    from passkit.pipeline import load_pipeline
    from passkit.runner import run_pipeline

    manifest = read_manifest(folder)
    recorded = manifest["step"]
    pipeline = load_pipeline(folder / "pipeline.toml", registry=registry)
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
    one_step = dataclasses.replace(pipeline, steps=(step,)).with_settings(dump="off", repro_dir="")
    kind, message = None, ""
    try:
        run_pipeline(one_step, program, pm=pm, registry=registry, reference=reference)
    except (PassError, VerificationError) as exc:
        cause = exc.__cause__ if isinstance(exc, PassError) and exc.__cause__ is not None else exc
        kind, message = failure_kind(cause), str(exc).strip().splitlines()[0]
    return Replay(
        folder=str(folder),
        label=pipeline.where(step),
        recorded_kind=manifest["failure"]["kind"],
        recorded_message=manifest["failure"]["message"],
        kind=kind,
        message=message,
        version_notes=notes,
    )
