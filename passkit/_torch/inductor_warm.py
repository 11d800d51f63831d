"""Own what makes Inductor's start in a warm process cheap: the FX graph cache key a compile
cache entry stores, and the CPU capability an entry is keyed on.

- **The stored key.** On a hit, ``codegen.inductor``'s compile cache runs Inductor's inner
  compiler on the stored graph again, so Inductor's FX graph cache finds the code it generated.
  Finding it first means hashing the whole graph (``FxGraphCache.prepare_key``: a pickle of the
  graph, every input's metadata, the config, the torch and Triton sources), about 0.2-0.4 s a
  graph. The first compile already computed that key; the entry keeps it
  (``graph_key_of``), and the reload hands it back (``graph_key_given``) instead of hashing
  again. What the key covers besides the graph and its inputs (Inductor's config, the torch
  version, the CPU's vector capability) is in passkit's own entry key, so a stored key is only
  used where Inductor would have computed the same one. Where torch's ``prepare_key`` is not the
  one this was written for, the key is computed as before.
- **No precompiled header on a load.** Loading a kernel library that is on disk still checks
  Inductor's precompiled header first (a preprocessor run, 0.17 s a process), or builds it on a
  fresh machine (seconds), though only a build uses it. ``no_precompiled_header`` skips it on
  one thread; a kernel built there after all is built without it (slower, the same code).
Inductor's CPU probes, the other once-per-process cost of a warm start, are
``passkit._torch.cpu_probes``'s.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Any, Iterator

import torch

__all__ = ["cpu_capability", "graph_key_given", "graph_key_of", "no_precompiled_header"]

GraphKey = tuple[str, list[str]]  # Inductor's FX graph cache key and its debug lines

_given = threading.local()
_install_lock = threading.Lock()
_PREPARE_KEY_PARAMETERS = ["gm", "example_inputs", "fx_kwargs", "inputs_to_check", "remote"]


def graph_key_of(compiled: Any) -> GraphKey | list[GraphKey | None] | None:
    """The FX graph cache key Inductor filed ``compiled`` under (None when it bypassed the cache);
    for a graph compiled as calls to its pieces, each piece's."""
    pieces = getattr(compiled, "piece_keys", None)
    if isinstance(pieces, list):
        return pieces
    key = getattr(compiled, "_fx_graph_cache_key", None)
    lines = getattr(compiled, "_fx_graph_cache_debug_lines", None)
    if not isinstance(key, str):
        return None
    return key, list(lines) if isinstance(lines, (list, tuple)) else []


@contextlib.contextmanager
def graph_key_given(key: GraphKey | None) -> Iterator[None]:
    """Inside, the next graph this thread compiles with Inductor's inner compiler is looked up
    (and, on a miss, filed) under ``key`` without hashing it again."""
    if key is None or not _key_override_installed():
        yield
        return
    with _on_this_thread("key", key):
        yield


@contextlib.contextmanager
def no_precompiled_header() -> Iterator[None]:
    """Inside, a C++ kernel this thread loads or builds uses no precompiled header. For loads
    whose libraries are on disk: the header only speeds up a build, and checking it is a
    preprocessor run over torch's headers."""
    if not _header_skip_installed():
        yield
        return
    with _on_this_thread("no_header", True):
        yield


@contextlib.contextmanager
def _on_this_thread(name: str, value: Any) -> Iterator[None]:
    outer = getattr(_given, name, None)
    setattr(_given, name, value)
    try:
        yield
    finally:
        setattr(_given, name, outer)


def _key_override_installed() -> bool:
    """Stand in for ``FxGraphCache.prepare_key`` (once per process): it answers a key given on
    this thread and defers to Inductor's own otherwise. False where torch's differs."""
    from torch._inductor.codecache import FxGraphCache

    with _install_lock:
        current = inspect.getattr_static(FxGraphCache, "prepare_key")
        function = current.__func__ if isinstance(current, staticmethod) else current
        if getattr(function, "passkit_key_given", False):
            return True
        if not isinstance(current, staticmethod) or list(inspect.signature(function).parameters) != _PREPARE_KEY_PARAMETERS:
            return False

        def prepare_key(gm: Any, example_inputs: Any, fx_kwargs: Any, inputs_to_check: Any, remote: Any) -> Any:
            given = getattr(_given, "key", None)
            if given is None:
                return function(gm, example_inputs, fx_kwargs, inputs_to_check, remote)
            _given.key = None  # one graph: a body Inductor compiles inside it keys on its own
            return (given[0], list(given[1])), {}

        prepare_key.passkit_key_given = True  # type: ignore[attr-defined]
        FxGraphCache.prepare_key = staticmethod(prepare_key)  # type: ignore[method-assign]
        return True


def _header_skip_installed() -> bool:
    """Stand in for Inductor's ``_precompile_header`` (once per process): no header on a thread
    inside ``no_precompiled_header``, Inductor's own elsewhere. False where torch has none."""
    from torch._inductor import codecache

    with _install_lock:
        current = getattr(codecache, "_precompile_header", None)
        if not callable(current):
            return False
        if getattr(current, "passkit_header_skip", False):
            return True

        def precompile_header(*args: Any, **kwargs: Any) -> str | None:
            if getattr(_given, "no_header", None):
                return None  # the build option's "no precompiled header"
            return current(*args, **kwargs)

        precompile_header.passkit_header_skip = True  # type: ignore[attr-defined]
        codecache._precompile_header = precompile_header
        return True


def cpu_capability() -> str:
    """The vector instruction set ATen uses on this CPU (``AVX512``, ``AVX2``, ``DEFAULT``...)."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001 - an unknown capability only makes keys more specific
        return "unknown"
