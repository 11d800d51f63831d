"""Own reproducers: a folder that replays one failing step without the user's model or source.

``write_reproducer`` is called by the ``repro`` instrument when a step raises, breaks a fact or
changes numerics. The folder (``<root>/NN-<step id>``, never an existing one) holds:

- ``manifest.json``: the failing step (1-based number, position, id, pass and its
  fingerprint), the failure (kind and one-line message), the steps before it, and the installed
  versions of Python, torch, passkit and every plugin;
- ``pipeline.toml``: the resolved pipeline, self-contained (``passkit.artifacts.pipeline_file``);
- the program as it was before the step (``passkit.artifacts.program_file``): ``graphs/*.py``,
  ``program.json`` (signature, facts, input metadata) and the replayable ``program.pkl``;
- ``inputs.pt``: the real input values, when they are known (``verify = "numerics"``) and
  under ``MAX_INPUT_BYTES`` in all.

The root (``repro_root``) is ``settings.repro_dir`` when a pipeline sets it; else the
``PASSKIT_REPRO_DIR`` environment variable; else a folder of this process under the system temp
directory, ``<tmp>/passkit-<user>/repro/run_<date>_<time>-pid_<pid>``, as torch keeps its own
debug output out of the user's working directory. The one-line error names the folder.

``passkit repro`` loads the folder's pickles, so the root and every folder passkit makes under
it are private (``passkit.core.private_folders``): created with mode 0700, and refused when the
group or others can write one or another user owns it (on a shared machine, someone else may
create ``<tmp>/passkit-<user>`` first). A refused root gets one warning line naming the folder
and the fix, and the reproducers go to a fresh private folder (``tempfile.mkdtemp``) instead.

The stored pipeline writes no report (``report = ""``): replaying it must never overwrite the
failing run's page, or write anywhere outside the reproducer's folder.

``passkit.debug.replay`` replays the folder. This module imports nothing above the built-ins
layer, so the ``repro`` instrument can use it.
"""

from __future__ import annotations

import functools
import getpass
import importlib.metadata
import json
import logging
import os
import platform
import re
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from passkit import _torch
from passkit.artifacts.pipeline_file import pipeline_toml
from passkit.artifacts.program_file import write_program
from passkit.core.private_folders import MODE, UnsafeFolderError, private_folder
from passkit.errors import NUMERICS_MARKER, VerificationError

if TYPE_CHECKING:
    from passkit.core.hookspecs import StepContext
    from passkit.pipeline import Settings
    from passkit.core.program import Program

__all__ = ["MAX_INPUT_BYTES", "MANIFEST", "FORMAT", "REPRO_ENV", "WHAT", "failure_kind", "private_root", "repro_root", "versions", "write_reproducer"]

REPRO_ENV = "PASSKIT_REPRO_DIR"

MAX_INPUT_BYTES = 64 * 2**20
MANIFEST = "manifest.json"
FORMAT = 1
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
WHAT = "reproducer folder"  # how refusals name the root

log = logging.getLogger("passkit")


def failure_kind(exc: BaseException) -> str:
    """``numerics``, ``fact`` (a broken fact) or ``crash`` (the pass raised)."""
    if isinstance(exc, VerificationError):
        return "numerics" if NUMERICS_MARKER in str(exc) else "fact"
    return "crash"


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    if isinstance(exc, VerificationError):
        return lines[0] if lines else ""
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def repro_root(settings: Settings) -> Path:
    """Where this run's reproducers go: ``settings.repro_dir``, else ``$PASSKIT_REPRO_DIR``, else
    this process's folder under the system temp directory (``repro_dir = ""`` writes none)."""
    if settings.repro_dir:
        return Path(settings.repro_dir)
    from_env = os.environ.get(REPRO_ENV, "")
    return Path(from_env) if from_env else _process_folder()


def _user_folder() -> Path:
    """``<tmp>/passkit-<user>``: the shared temp directory's folder for this user's runs."""
    try:
        user = re.sub(r"[^A-Za-z0-9_.-]+", "_", getpass.getuser())
    except Exception:  # noqa: BLE001 - no login name (a container's bare uid): name the uid
        user = str(os.getuid()) if hasattr(os, "getuid") else "user"
    return Path(tempfile.gettempdir()) / f"passkit-{user}"


@functools.cache
def _process_folder() -> Path:
    # One folder per process, named like torch's debug folders (run_<time>-pid_<pid>), so the
    # reproducers of one run sit together and two runs never number into each other's folders.
    run = f"run_{time.strftime('%Y_%m_%d_%H_%M_%S')}-pid_{os.getpid()}"
    return _user_folder() / "repro" / run


@functools.cache
def _fresh_folder(refused: Path) -> Path:
    # One per refused root and process, so one run's reproducers still sit together.
    return Path(tempfile.mkdtemp(prefix="passkit-repro-"))


def private_root(settings: Settings) -> Path:
    """``repro_root(settings)``, created private (mode 0700); when it is refused (the group or
    others can write it or a folder passkit made above it, another user owns one), one warning
    line says why and a fresh private folder stands in for it."""
    root = repro_root(settings)
    # The default root is checked from <tmp>/passkit-<user> down: that is the folder another
    # user of the machine could make first.
    trusted_from = _user_folder() if root == _process_folder() else root
    try:
        return private_folder(root, WHAT, trusted_from=trusted_from)
    except UnsafeFolderError as exc:
        fresh = _fresh_folder(root)
        log.warning("passkit: %s; this run's reproducers go to %s", exc, fresh)
        return fresh


def _unique_folder(root: Path, stem: str) -> Path:
    candidate, n = root / stem, 1
    while True:
        try:
            candidate.mkdir(mode=MODE)
            return candidate
        except FileExistsError:
            n += 1
            candidate = root / f"{stem}-{n}"


def versions() -> dict[str, Any]:
    """Python, torch and passkit, and each installed plugin (``passkit`` entry point) with its
    distribution and version."""
    from passkit import __version__

    plugins = {}
    for entry_point in importlib.metadata.entry_points(group="passkit"):
        dist = entry_point.dist
        plugins[entry_point.name] = f"{dist.metadata['Name']} {dist.version}" if dist is not None else ""
    try:
        passkit_version = importlib.metadata.version("passkit")
    except importlib.metadata.PackageNotFoundError:
        passkit_version = __version__
    return {"python": platform.python_version(), "torch": _torch.TORCH_VERSION, "passkit": passkit_version, "plugins": dict(sorted(plugins.items()))}


def _pass_origin(fn: Any) -> dict[str, str]:
    """The module that defines a pass, and the installed distribution that ships it, if any."""
    module = getattr(fn, "__module__", "") or ""
    dists = importlib.metadata.packages_distributions().get(module.split(".")[0], [])
    dist = dists[0] if dists else ""
    return {"module": module, "distribution": f"{dist} {importlib.metadata.version(dist)}" if dist else ""}


def _input_values(real_inputs: list[Any] | None) -> list[Any] | None:
    if real_inputs is None:
        return None
    size = sum(x.numel() * x.element_size() for x in real_inputs if isinstance(x, torch.Tensor))
    if size > MAX_INPUT_BYTES:
        return None
    return [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in real_inputs]


def write_reproducer(context: StepContext, before: Program, exc: BaseException, *, faithful: bool = True) -> Path:
    """Write the reproducer for ``context``'s step, which raised ``exc`` on ``before``.

    ``faithful`` says whether ``before`` has the graphs the failing run had before the step.
    """
    step, pipeline = context.step, context.pipeline
    number = step.position + 1
    folder = _unique_folder(private_root(pipeline.settings), f"{number:02d}-{_UNSAFE.sub('_', step.id)}")
    unportable = write_program(before, folder, header=f"before step {number} ({step.id}) of {pipeline.label}")
    reference = context.reference
    values = _input_values(getattr(reference, "real_inputs", None))
    if values is not None:
        torch.save(values, folder / "inputs.pt")
    (folder / "pipeline.toml").write_text(
        pipeline_toml(pipeline, comment=f"resolved from {pipeline.label} by a passkit reproducer", report=""),
        encoding="utf-8",
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
            **_pass_origin(step.pass_.fn),
        },
        "failure": {"kind": failure_kind(exc), "message": _one_line(exc)},
        "previous": list(context.previous),
        "verify": pipeline.settings.verify,
        "replayable": unportable is None,
        "same_graphs_as_the_failing_run": faithful,
        "not_replayable_because": unportable,
        "input_values": "inputs.pt" if values is not None else None,
        "versions": versions(),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return folder
