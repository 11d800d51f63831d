"""Own ``passkit.package``: an ``ExportedProgram`` compiled ahead of time into an AOTInductor
package, with a pipeline file's slot steps mounted in Inductor for that compile.

``aoti_compile_and_package`` runs Inductor over the exported graph; the steps of ``pipeline``
that name an Inductor slot run there, exactly as ``passkit.inductor_options`` mounts them for
``torch.compile``. The package's metadata (``aot_inductor.metadata``, read back with
``aoti_load_package(path).get_metadata()``) records passkit's version, the export pipeline and
its fingerprint when the program came from ``passkit.export`` (``passkit.export_pipeline``; the
record travels in the graph through ``torch.export.save`` and ``load``), and as ``passkit.pipeline`` the pipeline whose steps ran in
Inductor, else the export pipeline.

A program that ``passkit.export`` decomposed with a table Inductor does not take as input (a
plugin's own opset) is refused in one line: Inductor lowers Core ATen, or its own table's
output, and "breaks in nasty ways" on anything else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from passkit import _torch
from passkit.errors import PasskitError

__all__ = ["INDUCTOR_TABLES", "EXPORT_ATTRIBUTE", "export_record", "package", "package_metadata", "stamp_export_record"]

INDUCTOR_TABLES = frozenset({"core_aten", "inductor"})  # what Inductor's lowerings take as input
EXPORT_ATTRIBUTE = "passkit_export"  # what passkit.export leaves on the ExportedProgram it returns
# The same record in a node's ``meta["custom"]``, which torch.export.save and load keep (an
# attribute of the ExportedProgram is lost there): the graph's last call carries it.
STAMP_KEY = "passkit.export"


def stamp_export_record(exported: Any, record: dict[str, Any]) -> None:
    """Leave ``record`` (pipeline, fingerprint, tables, facts) on ``exported`` and in its graph."""
    setattr(exported, EXPORT_ATTRIBUTE, record)
    calls = [n for n in exported.graph.nodes if n.op == "call_function"]
    if calls:
        calls[-1].meta.setdefault("custom", {})[STAMP_KEY] = json.dumps(record, sort_keys=True)


def export_record(exported: Any) -> dict[str, Any]:
    """What ``passkit.export`` recorded about how it made ``exported`` ({} for another program)."""
    record = getattr(exported, EXPORT_ATTRIBUTE, None)
    if record:
        return record
    for node in reversed(list(exported.graph.nodes)):
        stamped = node.meta.get("custom", {}).get(STAMP_KEY)
        if stamped:
            return json.loads(stamped)
    return {}


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
    exported_by = export_record(exported)
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
