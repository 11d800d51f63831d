"""Own what makes Inductor's start in a warm process cheap: the FX graph cache key a compile
cache entry stores, and Inductor's once-per-process CPU probes run early.

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
- **The probes.** Before its first C++ kernel Inductor checks which vector instructions the
  CPU and compiler support: it loads a probe library per instruction set in a fresh Python
  process (``valid_vec_isa_list``), about 1.8 s that every process pays once, cache hit or not.
  ``start_cpu_probes`` runs them on a daemon thread when the backend is built, so the child
  processes run on another core while Dynamo traces and the entry loads. Every passkit call
  into Inductor waits for that thread first (``cpu_probes_settled``): the probes never run twice
  at once, and no passkit graph compiles while the answer is still open. (An earlier version did
  not wait, and a process could compile with another instruction set than the next one chose.)
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import threading
from typing import Any, Iterator

import torch

__all__ = ["cpu_capability", "cpu_probes_settled", "graph_key_given", "graph_key_of", "start_cpu_probes"]

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
    outer, _given.key = getattr(_given, "key", None), key
    try:
        yield
    finally:
        _given.key = outer


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


def cpu_capability() -> str:
    """The vector instruction set ATen uses on this CPU (``AVX512``, ``AVX2``, ``DEFAULT``...)."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001 - an unknown capability only makes keys more specific
        return "unknown"


_probes: threading.Thread | None = None
_probes_lock = threading.Lock()


def start_cpu_probes() -> None:
    """Run Inductor's CPU vector-instruction probes on a daemon thread, once per process. Not
    where CUDA is present (the first kernels are Triton's), nor once the answer is known."""
    global _probes
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    with _probes_lock:
        cache_info = getattr(valid_vec_isa_list, "cache_info", None)  # a functools cache on 2.11-2.13
        if _probes is not None or torch.cuda.is_available() or cache_info is None or cache_info().currsize:
            return

        # The probes import torch.utils.cpp_extension, and with it setuptools, whose distutils
        # shim puts a finder into sys.meta_path and takes it out again. An import on another
        # thread that walks sys.meta_path meanwhile skips a finder, the path finder among them,
        # and fails: Dynamo's trace, importing torch.distributed.tensor.experimental, did
        # (ModuleNotFoundError, now and then). So that import happens here, before the thread.
        importlib.import_module("torch.utils.cpp_extension")

        def probe() -> None:
            with contextlib.suppress(Exception):  # Inductor probes again, and reports, when it needs them
                valid_vec_isa_list()

        _probes = threading.Thread(target=probe, name="passkit-inductor-cpu-probes", daemon=True)
        _probes.start()


def cpu_probes_settled() -> None:
    """Wait for ``start_cpu_probes``'s thread, if one runs: call before handing Inductor a graph."""
    probes = _probes
    if probes is not None and probes is not threading.current_thread():
        probes.join()
