"""Own the wording of pipeline errors: file names, key paths, did-you-mean, pydantic errors.

Every message is one line that starts with the file name, e.g.
``x.toml: steps[2] (decompose).tables: Input should be a valid list``.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pydantic

__all__ = [
    "DEFAULT_ORIGIN",
    "ARGUMENT_ORIGIN",
    "CodeLocation",
    "display_source",
    "did_you_mean",
    "display_path",
    "toml_key",
    "render_loc",
    "first_validation_error",
    "accepted_keys",
]

DEFAULT_ORIGIN = "<default>"
ARGUMENT_ORIGIN = "<argument>"

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
# pydantic prefixes messages of custom validators; the option name already says where.
_MESSAGE_PREFIXES = ("Value error, ", "Assertion failed, ")


def did_you_mean(word: str, candidates: Iterable[str], *, template: str = "'{}'") -> str:
    """``"; did you mean 'x'?"`` for the closest candidate, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {template.format(close[0])}?" if close else ""


def display_path(path: Path) -> str:
    """The path as a reader finds it: relative to the working directory when it lies below it,
    else relative to the folder holding the Python package it lies in (a shipped pipeline reads
    ``passkit/pipelines/training.toml`` wherever passkit is installed), else absolute; never
    with ``..`` segments."""
    absolute = Path(os.path.normpath(path.absolute()))
    try:
        return str(absolute.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        pass
    package = next((parent for parent in absolute.parents if (parent / "__init__.py").is_file()), None)
    while package is not None and (package.parent / "__init__.py").is_file():
        package = package.parent
    return str(absolute.relative_to(package.parent)) if package is not None else str(absolute)


@dataclass(frozen=True)
class CodeLocation:
    """The Python line that handed passkit a pipeline as a dict: where its values came from.

    It stands where a file's path stands (``Pipeline.source``, the extends chain, origins), so
    messages and ``explain`` read ``nb.py:12`` where a file would read ``my.toml``.
    """

    path: Path
    line: int

    @property
    def stem(self) -> str:
        """The Python file's stem: a dict pipeline's name when it sets none, as a file's stem is."""
        return self.path.stem if self.path.suffix == ".py" else self.path.name

    def __str__(self) -> str:
        # <stdin> and <string> are no paths: shown as Python shows them
        shown = str(self.path) if str(self.path).startswith("<") else display_path(self.path)
        return f"{shown}:{self.line}"


def display_source(source: Path | CodeLocation) -> str:
    """A pipeline's source as messages show it: a file like ``display_path``, a dict's line as ``nb.py:12``."""
    return str(source) if isinstance(source, CodeLocation) else display_path(source)


def toml_key(key: str) -> str:
    """A key as TOML needs it written: bare when possible, else double-quoted."""
    return key if _BARE_KEY.match(key) else '"' + key.replace('"', '\\"') + '"'


def render_loc(loc: Iterable[Any]) -> str:
    """pydantic's ``('tables', 0)`` as ``.tables[0]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def first_validation_error(exc: pydantic.ValidationError) -> tuple[str, str]:
    """The first error of ``exc`` as (rendered location suffix, message)."""
    error = exc.errors(include_url=False)[0]
    message = error["msg"]
    for prefix in _MESSAGE_PREFIXES:
        if message.startswith(prefix):
            message = message[len(prefix) :]
    if error["type"] == "missing":
        message = "required, but not set"
    return render_loc(error["loc"]), message.splitlines()[0] if message else error["type"]


def accepted_keys(model: type[pydantic.BaseModel]) -> list[str]:
    """The keys a model accepts as input: field names, or their aliases when they have one."""
    keys = []
    for name, info in model.model_fields.items():
        alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
        keys.append(alias or name)
    return keys
