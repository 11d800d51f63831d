"""Own ``passkit.package``: an ``ExportedProgram`` compiled ahead of time into an AOTInductor
package, with a pipeline file's slot steps mounted in Inductor for that compile.

``aoti_compile_and_package`` runs Inductor over the exported graph; the steps of ``pipeline``
that name an Inductor slot run there, exactly as ``passkit.inductor_options`` mounts them for
``torch.compile``. The package's metadata (``aot_inductor.metadata``, read back with
``aoti_load_package(path).get_metadata()``) records passkit's version, the export pipeline and
its fingerprint when the program came from ``passkit.export`` in this process
(``passkit.export_pipeline``), and as ``passkit.pipeline`` the pipeline whose steps ran in
Inductor, else the export pipeline.

A program that ``passkit.export`` decomposed with a table Inductor does not take as input (a
plugin's own opset) is refused in one line: Inductor lowers Core ATen, or its own table's
output, and "breaks in nasty ways" on anything else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from passkit import _torch
from passkit.errors import PasskitError

__all__ = ["INDUCTOR_TABLES", "EXPORT_ATTRIBUTE", "package", "package_metadata"]

INDUCTOR_TABLES = frozenset({"core_aten", "inductor"})  # what Inductor's lowerings take as input
EXPORT_ATTRIBUTE = "passkit_export"  # what passkit.export leaves on the ExportedProgram it returns


def package(exported: Any, path: str | Path, *, pipeline: Any = None, **inductor_options: Any) -> str:
    """Compile ``exported`` (an ``ExportedProgram``) into an AOTInductor package at ``path`` and
    return the package's path.

    ``pipeline`` is a pipeline file whose steps name Inductor slots (as for
    ``passkit.inductor_options``); ``inductor_options`` are Inductor config entries for this
    compile (``max_autotune=True``...).

    Raises:
        PasskitError: the program was decomposed with a table Inductor does not take.
        PipelineError: a step of ``pipeline`` cannot run in its slot.
    """
    import torch

    if not isinstance(exported, torch.export.ExportedProgram):
        raise PasskitError(f"passkit.package: expected an ExportedProgram, got {type(exported).__name__}")
    exported_by = getattr(exported, EXPORT_ATTRIBUTE, None) or {}
    foreign = sorted(set(exported_by.get("tables", ())) - INDUCTOR_TABLES)
    if foreign:
        raise PasskitError(
            f"passkit.package: the program was decomposed with table {foreign[0]!r} "
            f"({exported_by.get('pipeline', '?')}), which Inductor does not take as input; "
            f"export it with {' or '.join(sorted(INDUCTOR_TABLES))}"
        )
    configs: dict[str, Any] = {key.replace("__", "."): value for key, value in inductor_options.items()}
    mounted = None
    if pipeline is not None:
        from passkit.frontends.inductor_slots import mount

        mounted = mount(pipeline)
        configs.update(mounted.options())
    configs["aot_inductor.metadata"] = {**configs.get("aot_inductor.metadata", {}), **package_metadata(exported_by, mounted)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return _torch.aoti_package(exported, path, configs)


def package_metadata(exported_by: dict[str, Any], mounted: Any) -> dict[str, str]:
    """What a package records of how it was made (strings, as AOTInductor's metadata takes)."""
    from passkit import __version__

    metadata = {"passkit.version": __version__}
    if exported_by:
        metadata["passkit.export_pipeline"] = str(exported_by["pipeline"])
        metadata["passkit.export_fingerprint"] = str(exported_by["fingerprint"])
        metadata["passkit.pipeline"] = metadata["passkit.export_pipeline"]
        metadata["passkit.fingerprint"] = metadata["passkit.export_fingerprint"]
    if mounted is not None:  # the package's own pipeline: the one whose steps ran in Inductor
        metadata["passkit.pipeline"] = mounted.pipeline.name
        metadata["passkit.fingerprint"] = mounted.pipeline.fingerprint()
    return metadata
