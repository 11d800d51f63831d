"""Own the files Inductor reads when it loads a graph it compiled before, so that a compile cache
entry can carry them to a machine that never compiled it.

A warm load of a ``codegen.inductor`` graph runs Inductor's inner compiler again and counts on
Inductor's own cache folder (``TORCHINDUCTOR_CACHE_DIR``) to answer: its FX graph cache entry
(the generated module; off the CPU, its Triton binaries too) and, on the CPU, the C++ kernel
libraries that module loads. A process on another machine, or in a fresh container, has an
empty folder: it would lower and build everything again, and on a node of eight ranks, eight
times. So an entry keeps those files (``built_files``), read once its kernels are bound, and a
load writes the missing ones back before Inductor looks (``built_files_installed``): another
machine then loads without generating code or running the C++ compiler.

Inside ``built_files_installed``, when every library the entry names is on disk, this thread
skips Inductor's precompiled header (``no_precompiled_header``): checking it costs a preprocessor
run over torch's headers (0.17 s a process on a 2-core EPYC), and building it seconds on a fresh
machine, for kernels that are built already. A kernel that must be built there after all
(another machine's compiler flags key it elsewhere) is built without the header: slower, the
same code.

The files are trusted as the entry is: its signature is checked before any of this runs.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import types
from pathlib import Path
from typing import Any, Iterator

from passkit._torch.inductor_warm import no_precompiled_header

__all__ = ["built_files", "built_files_installed"]

MAX_BYTES = 128 * 2**20  # an entry carries no files past this; another machine then lowers again
FX_GRAPH_FOLDER = "fxgraph"


def _inductor_dir() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def _keys(graph_key: Any) -> list[str]:
    """Inductor's FX graph cache keys in ``_torch.graph_key_of``'s answer (a key, or pieces' keys)."""
    if isinstance(graph_key, tuple) and graph_key and isinstance(graph_key[0], str):
        return [graph_key[0]]
    if isinstance(graph_key, list):
        return [key for piece in graph_key for key in _keys(piece)]
    return []


def _scopes(compiled: Any) -> list[dict[str, Any]]:
    """The module scopes a compiled graph's kernels are bound in (a graph cut at its region calls:
    each piece's)."""
    pieces = getattr(compiled, "pieces", None)
    if isinstance(pieces, list):
        return [scope for piece in pieces for scope in _scopes(piece)]
    function = getattr(compiled, "current_callable", compiled)
    scope = getattr(function, "__globals__", None)
    return [scope] if isinstance(scope, dict) else []


def _libraries(scopes: list[dict[str, Any]], root: Path) -> set[Path]:
    """The C++ kernel libraries under Inductor's folder whose functions ``scopes`` hold."""
    found: set[Path] = set()
    for scope in scopes:
        for value in list(scope.values()):
            library = getattr(value, "__self__", None) if isinstance(value, types.BuiltinFunctionType) else None
            path = getattr(library, "__file__", None) if isinstance(library, types.ModuleType) else None
            if isinstance(path, str) and Path(path).is_relative_to(root):
                found.add(Path(path))
    return found


def built_files(compiled: Any, graph_key: Any) -> dict[str, bytes] | None:
    """The files under Inductor's folder that loading ``compiled`` again reads, by path relative to
    the folder: its FX graph cache entries (``graph_key``) and its kernel libraries. Call once its
    kernels are bound. None when there are none, or they are too many bytes to carry."""
    root = _inductor_dir()
    files: dict[str, bytes] = {}
    total = 0
    try:
        paths = _libraries(_scopes(compiled), root)
        for key in _keys(graph_key):
            entry_dir = root / FX_GRAPH_FOLDER / key[1:3] / key
            if entry_dir.is_dir():
                paths.update(p for p in entry_dir.iterdir() if p.is_file())
        for path in sorted(paths):
            data = path.read_bytes()
            total += len(data)
            if total > MAX_BYTES:
                return None
            files[path.relative_to(root).as_posix()] = data
    except OSError:  # evicted meanwhile: carry none rather than a set that cannot load
        return None
    return files or None


def _write_missing(files: dict[str, bytes], root: Path) -> bool:
    """Write each file that is not under ``root`` yet (whole or not at all); True when every
    library among them is there afterwards."""
    libraries_present = True
    for relative, data in files.items():
        parts = Path(relative).parts
        if Path(relative).is_absolute() or ".." in parts:
            continue
        target = root.joinpath(*parts)
        if not target.exists():
            temporary = None
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
                with os.fdopen(fd, "wb") as stream:
                    stream.write(data)
                os.chmod(temporary, 0o755 if target.suffix == ".so" else 0o644)
                os.replace(temporary, target)  # another process writing the same file leaves one whole
            except OSError:  # a folder we cannot write: Inductor then builds what is missing
                if temporary is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(temporary)
        if target.suffix == ".so" and not target.exists():
            libraries_present = False
    return libraries_present


@contextlib.contextmanager
def built_files_installed(files: dict[str, bytes] | None) -> Iterator[None]:
    """Inside, Inductor on this thread finds ``files`` (``built_files``) in its folder, and builds
    no precompiled header for kernels whose libraries they hold."""
    if files and _write_missing(files, _inductor_dir()) and any(name.endswith(".so") for name in files):
        with no_precompiled_header():
            yield
    else:
        yield
