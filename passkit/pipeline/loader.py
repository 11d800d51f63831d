"""Own loading a pipeline: find the file (by name or path), read TOML, follow ``extends``,
validate everything and check the fact contracts, before any step runs.

Loading never runs code from the file: TOML is data, and only installed plugins provide passes.
A dict with a file's keys loads the same way (``passkit.pipeline.dicts``: attributed to the
Python line that handed it over, its steps may name ``Pass`` objects); its ``extends`` names a
pipeline, or a file relative to the working directory, as Python's own ``open`` reads paths.
"""

from __future__ import annotations

import os
import re
import threading
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from passkit.errors import PipelineError
from passkit.pipeline.contracts import check_contracts
from passkit.pipeline.dicts import caller_location, mark_unregistered, python_document
from passkit.pipeline.messages import CodeLocation, did_you_mean, display_path
from passkit.pipeline.model import Pipeline
from passkit.pipeline.overlay import Draft, apply_file, check_top_level, finalize, read_header
from passkit.pipeline.exports import PROGRAM_KINDS, check_export
from passkit.pipeline.slots import check_slots

if TYPE_CHECKING:
    from passkit.core.registry import Registry

__all__ = ["load_pipeline", "is_pipeline_name", "read_toml"]

_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_TOML_AT_END = re.compile(r"\s*\(at end of document\)$")

# Parsed documents by (resolved path, mtime, size): TOML parsing is pure, so this is safe.
_parsed: dict[tuple[str, int, int], dict[str, Any]] = {}

# Pipelines loaded by name or path, by (spec, working directory, mounted): the registry they were
# checked against, every file read (as ``_parsed`` keys them) and the pipeline, which is
# immutable. Validating every step's options and the contracts again cost each
# ``aot_function`` call a millisecond or two (one per OpInfo sample in a sweep); a changed
# file, another registry or another working directory (relative paths, file names in messages)
# loads again.
_loaded: dict[tuple[str, str, bool], tuple[Any, tuple[tuple[str, int, int], ...], Pipeline]] = {}
_MAX_LOADED = 64  # each test's own working directory would otherwise add entries forever
_reading = threading.local()  # .files: the files the load under way on this thread read


def is_pipeline_name(text: str) -> bool:
    """Whether ``text`` names a registered pipeline rather than a path to a file."""
    separators = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    return not any(sep in text for sep in separators) and not text.endswith(".toml")


def _syntax_error(file: str, text: str, exc: tomllib.TOMLDecodeError) -> PipelineError:
    message = str(exc)
    match = _TOML_POSITION.search(message)
    if match:
        line, column = match.group(1), match.group(2)
        message = message[: match.start()]
    else:
        lines = text.split("\n")
        line, column = str(len(lines)), str(len(lines[-1]) + 1)
        message = _TOML_AT_END.sub("", message)
    return PipelineError(f"{file}:{line}:{column}: invalid TOML: {message}")


def read_toml(path: Path, file: str) -> dict[str, Any]:
    """Parse ``path``; errors name ``file`` (and line and column for syntax errors).

    The returned document is shared with a cache: treat it as read-only.
    """
    try:
        stat = path.stat()
    except OSError:
        raise PipelineError(f"passkit: pipeline file not found: {file}") from None
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    files = getattr(_reading, "files", None)
    if files is not None:
        files.append(key)
    cached = _parsed.get(key)
    if cached is not None:
        return cached
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PipelineError(f"{file}: cannot read: {type(exc).__name__}: {exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _syntax_error(file, text, exc) from None
    _parsed[key] = doc
    return doc


def _locate(reference: str | Path, registry: Registry, referrer: tuple[Path, str] | None) -> tuple[Path, str]:
    """Resolve a pipeline name or path to (path, display name); ``referrer`` is the extending file."""
    prefix = f"{referrer[1]}: extends" if referrer else "passkit"
    if isinstance(reference, str) and is_pipeline_name(reference):
        path = registry.pipelines.get(reference)
        if path is None:
            known = sorted(registry.pipelines)
            hint = did_you_mean(reference, known)
            if not hint:
                hint = f"; registered pipelines: {', '.join(known)}" if known else "; no pipelines are registered"
            raise PipelineError(f"{prefix}: unknown pipeline {reference!r}{hint}")
        return path, display_path(path)
    path = Path(reference)
    if referrer is not None and not path.is_absolute():
        path = referrer[0].parent / path
    file = display_path(path)
    if not path.is_file():
        shown = file if referrer is not None else str(reference)
        hint = _missing_file_hint(path, registry, referrer[0] if referrer else None)
        raise PipelineError(f"{prefix}: pipeline file not found: {shown}{hint}")
    return path, file


def _missing_file_hint(path: Path, registry: Registry, referrer: Path | None) -> str:
    """Did-you-mean for a missing file: a registered pipeline written as a file name
    (``training-python.toml`` for ``training-python``), else a close file beside it, else a
    close pipeline name. Stems are compared, since a shared ``.toml`` makes any two names alike."""
    stem = path.stem if path.suffix == ".toml" else path.name
    as_name = " (a name, without .toml)" if path.suffix == ".toml" else ""
    if stem in registry.pipelines:
        return f"; did you mean the pipeline {stem!r}{as_name}?"
    try:
        siblings = {sibling.stem: sibling for sibling in path.parent.glob("*.toml") if sibling.is_file()}
    except OSError:
        siblings = {}
    if referrer is not None:
        siblings = {name: sibling for name, sibling in siblings.items() if sibling.resolve() != referrer.resolve()}
    hint = did_you_mean(stem, siblings, template="'{}.toml'")
    return hint or did_you_mean(stem, registry.pipelines, template=f"the pipeline '{{}}'{as_name}")


def _resolve(path: Path, file: str, registry: Registry, chain: tuple[tuple[Path, str], ...]) -> Draft:
    """Read ``path`` and everything it extends into a draft, base first."""
    resolved = path.resolve()
    if any(resolved == seen for seen, _ in chain):
        cycle = " -> ".join([*(name for _, name in chain), file])
        raise PipelineError(f"{chain[0][1]}: extends cycle: {cycle}")
    return _apply(read_toml(path, file), path, path, file, registry, (*chain, (resolved, file)))


def _apply(
    doc: dict[str, Any], source: Path | CodeLocation, anchor: Path, file: str, registry: Registry,
    chain: tuple[tuple[Path, str], ...],
) -> Draft:
    """Apply a document onto what it extends (found from ``anchor``'s folder), base first."""
    check_top_level(doc, file)
    header = read_header(doc, file)
    if header.extends is not None:
        base_path, base_file = _locate(header.extends, registry, referrer=(anchor, file))
        draft = _resolve(base_path, base_file, registry, chain)
    else:
        draft = Draft()
    apply_file(draft, doc, header, source, file, registry)
    return draft


def load_pipeline(
    spec: str | Path | Mapping[str, Any] | Pipeline, *, registry: Registry, mounted: bool = False
) -> Pipeline:
    """Load, validate and contract-check a pipeline given by name, by path, as a dict with a
    file's keys, or as a ``Pipeline``.

    Every step's pass, every option that names a registered thing and every settings key is
    resolved against ``registry``; a dict's steps may also name ``Pass`` objects no plugin
    registered.

    A str without a path separator and without a ``.toml`` suffix names a registered pipeline;
    anything else is a path. The contracts are checked for the training plan when the pipeline
    can train, else for the inference plan. A file whose steps name Inductor slots (or any file
    with ``mounted``) is checked as a mounted file instead (``passkit.pipeline.slots``): every
    step gets its slot, and no codegen step is needed.

    Raises:
        PipelineError: one line, starting with the file that holds the mistake (for a dict, the
            Python line that handed it over: ``nb.py:12``).
    """
    if isinstance(spec, Pipeline):
        return check_slots(spec, registry) if mounted else spec
    if not isinstance(spec, (str, Path)):
        return _load(spec, registry, mounted)
    key = (str(spec), os.getcwd(), mounted)
    held = _loaded.get(key)
    if held is not None and held[0] is registry and all(_unchanged(file) for file in held[1]):
        return held[2]
    outer = getattr(_reading, "files", None)
    _reading.files = files = []
    try:
        pipeline = _load(spec, registry, mounted)
    finally:
        _reading.files = outer
        if outer is not None:  # a load inside another: the outer one depends on these files too
            outer.extend(files)
    if len(_loaded) >= _MAX_LOADED:
        _loaded.clear()
    _loaded[key] = (registry, tuple(files), pipeline)
    return pipeline


def _unchanged(file: tuple[str, int, int]) -> bool:
    path, mtime, size = file
    try:
        stat = os.stat(path)
    except OSError:
        return False
    return (stat.st_mtime_ns, stat.st_size) == (mtime, size)


def _load(spec: str | Path | Mapping[str, Any], registry: Registry, mounted: bool) -> Pipeline:
    source: Path | CodeLocation
    unregistered: dict[str, Any] = {}
    if isinstance(spec, Mapping):
        source = caller_location()
        file = str(source)
        doc, registry, unregistered = python_document(spec, file, registry)
        chain = ((source.path.resolve(), file),)
        draft = _apply(doc, source, Path.cwd() / "<python>", file, registry, chain)
    else:
        source, file = _locate(spec, registry, referrer=None)
        draft = _resolve(source, file, registry, ())
    pipeline = finalize(draft, source=source, settings_model=registry.settings_model)
    if unregistered:
        pipeline = mark_unregistered(pipeline, unregistered)
    if mounted or pipeline.mounted:
        return check_slots(pipeline, registry)
    if pipeline.kind in PROGRAM_KINDS:
        return check_export(pipeline, registry)
    check_contracts(pipeline, registry, training=pipeline.can_train)
    return pipeline
