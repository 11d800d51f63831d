"""Own the on-disk compile cache: its entries, their format, atomic writes and corruption checks.

A fresh process compiling the same program with the same pipeline loads the compiled graphs
instead of running the steps. The key (``cache_key``) covers everything that decides the result:

- the resolved pipeline (``Pipeline.fingerprint``: every step, its options, ``when``/``enabled``
  and each pass's fingerprint, which hashes its module's source file and its distribution's
  version, so editing a plugin invalidates its entries);
- the registered plugins (a ``passkit_should_run_step`` or ``passkit_should_apply`` plugin changes
  which steps or pattern applications run);
- the captured graphs' code, the values of constants they hold, the input metadata (shape,
  stride, dtype, device, ``requires_grad``; symbolic sizes by name) and the signature;
- a symbolic program's signature (``_torch.symbolic_signature``: its shape environment's guards
  and its symbols' ranges); the entry also stores the guards after compiling, and a hit adds
  them to the loading process's shape environment (or compiles, if one fails for its sizes);
- what a step's ``cache_context`` names outside the program and options (``codegen.inductor``:
  a digest of Inductor's global config with the step's settings applied);
- the torch, Python and passkit versions, and the device;
- torch's process-wide settings that tracing or code generation reads (``global_settings``):
  autocast entered outside the compiled code, the default dtype, grad mode, deterministic
  algorithms, the float32 matmul precision and the CUDA/cuDNN reduced-precision switches.
  Dynamo guards on these and Inductor's and AOT Autograd's caches key on them; an entry holds
  traced and compiled code, so a program compiled outside ``torch.autocast`` is never loaded
  inside it (its output would stay float32), nor one compiled before
  ``torch.use_deterministic_algorithms(True)`` after it;
- a digest of passkit's own files (``passkit_source_digest``: every ``passkit/**/*.py`` and
  shipped pipeline file, read once per process), so an upgrade or a local edit of the runtime,
  capture or a built-in pass never loads an entry that other passkit code compiled.

An entry is one file ``<key>.entry`` under ``cache_dir()`` (``PASSKIT_CACHE_DIR``, else the
user cache directory): a magic line, the sha256 and length of the payload, then the pickled
payload (final graphs, signature, facts, compiled callables, report). It is written to a
temporary file in the same folder and renamed over the target (``os.replace``), so readers
never see half an entry and concurrent writers of one key both succeed. An entry that fails
its checks (truncated, corrupted, unloadable) is deleted with one warning line and the program
is compiled again.
The folder's size limit and least-recently-used eviction (a hit counts as a use) are
``passkit.cache.folder``'s. A hit's report carries its own load time (``Report.load_seconds``).

Compiled callables are stored as follows (the hook point for code generators):

- a ``GraphModule``'s bound ``forward`` (what ``codegen.python`` produces) is stored as its
  graph, node by node with the nodes' metadata (``_torch.dumps_graphs``; the program's graphs
  are stored the same way), and must print the same code when it is rebuilt, as must each
  graph module it holds (an outlined region's body). Only when every function its graphs call
  is found again by its module and name (ATen ops, torch functions, ``operator``, higher-order
  ops such as ``invoke_subgraph`` under ``torch.ops.higher_order``): a closure or a kernel
  object would not survive that round trip, and a program that reloads different code is
  worse than one that compiles again. Plain pickling is not used: it re-traces the generated
  code, which turns random factory calls into constants and drops the fake values the runtime
  wrapper reads;
- any other callable is stored if it has a ``passkit_cache_payload()`` method returning
  ``(loader, data)``: ``loader`` is a ``"module:function"`` string and ``data`` picklable;
  loading calls ``function(data)`` to get the callable back. ``codegen.inductor`` gives its
  compiled graphs one (``passkit.passes.codegen_inductor_cache``). A method returning
  ``None`` opts out for that program, and so does a callable with neither form: the program
  then compiles every time (``cache_info`` still works).

The folder must be private to the user (``passkit.cache.folder.usable_cache_dir``): a refused
folder means no cache for the compile, neither read nor written.
Entries are only read when the run does not watch its steps (``verify`` and ``dump`` off), since
a hit runs no step; they are written whenever ``cache = "on"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import inspect
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
from torch.fx import GraphModule

from passkit import _torch
from passkit.cache.folder import (
    CACHE_ENV,
    SUFFIX,
    TEMP_SUFFIX,
    CacheInfo,
    cache_dir,
    cache_info,
    after_write,
    clear_cache,
    usable_cache_dir,
    touch,
)
from passkit.cache.key import FORMAT, cache_key, global_settings, plan_digest

if TYPE_CHECKING:
    from passkit.pipeline import Pipeline
    from passkit.core.program import Program
    from passkit.core.report import Report

__all__ = [
    "CACHE_ENV",
    "cache_dir",
    "cache_key",
    "plan_digest",
    "global_settings",
    "cache_enabled",
    "CompileCache",
    "CacheInfo",
    "cache_info",
    "clear_cache",
]

MAGIC = b"passkit-cache-entry v1\n"

log = logging.getLogger("passkit.cache")


class CorruptEntry(Exception):
    """An entry on disk that fails its checks; the message says which one."""


def cache_enabled(pipeline: Pipeline) -> bool:
    """Whether the pipeline's settings let the cache be written (``cache = "on"``)."""
    return getattr(pipeline.settings, "cache", "off") == "on"


def _readable(pipeline: Pipeline) -> bool:
    settings = pipeline.settings
    return cache_enabled(pipeline) and settings.verify == "off" and settings.dump == "off"


# ---------------------------------------------------------------------------------------------
# Entries on disk


def _encode(payload: bytes) -> bytes:
    return MAGIC + hashlib.sha256(payload).digest() + len(payload).to_bytes(8, "little") + payload


def _decode(blob: bytes) -> bytes:
    header = len(MAGIC) + 32 + 8
    if not blob.startswith(MAGIC):
        raise CorruptEntry("not a passkit cache entry")
    if len(blob) < header:
        raise CorruptEntry("truncated")
    digest, length = blob[len(MAGIC) : len(MAGIC) + 32], int.from_bytes(blob[header - 8 : header], "little")
    payload = blob[header:]
    if len(payload) != length:
        raise CorruptEntry(f"truncated ({len(payload)} of {length} bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptEntry("checksum mismatch")
    return payload


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _resolves_by_name(target: Any) -> bool:
    """Whether importing ``target``'s module and looking up its name gives ``target`` back (a
    higher-order op, ``invoke_subgraph`` calling a region's body: under ``torch.ops.higher_order``)."""
    if _torch.is_higher_order(target):
        return getattr(torch.ops.higher_order, target.name(), None) is target
    module = getattr(target, "__module__", None)
    if not isinstance(module, str):
        return False
    names = [n for n in (getattr(target, "__qualname__", None), getattr(target, "__name__", None)) if isinstance(n, str)]
    if module.startswith("torch._ops."):  # an ATen operator: torch.ops.<namespace>.<op>[.<overload>]
        root: Any = getattr(torch.ops, module.split(".", 2)[2], None)
        names = names[1:]
    else:
        try:
            root = importlib.import_module(module)
        except Exception:  # noqa: BLE001 - not importable means not storable
            return False
    for name in names:
        found = root
        try:
            for part in name.split("."):
                found = getattr(found, part)
        except AttributeError:
            continue
        if found is target:
            return True
    return False


def _reloads_faithfully(gm: GraphModule) -> bool:
    """Whether ``gm`` (and every submodule) is plain FX code over callables found by name."""
    for module in gm.modules():
        if not isinstance(module, GraphModule):
            return False
        for node in module.graph.nodes:
            if node.op == "call_function" and not _resolves_by_name(node.target):
                return False
    return True


def _store_callable(fn: Callable[..., Any]) -> tuple[str, Any] | None:
    owner = getattr(fn, "__self__", None)
    if inspect.ismethod(fn) and isinstance(owner, GraphModule) and fn.__name__ == "forward":
        return ("graph_module", (owner, _torch.graph_codes(owner))) if _reloads_faithfully(owner) else None
    payload = getattr(fn, "passkit_cache_payload", None)
    if callable(payload):
        described = payload()
        if described is not None:
            loader, data = described
            return ("loader", (str(loader), data))
    return None


def _load_callable(stored: tuple[str, Any]) -> Callable[..., Any]:
    kind, data = stored
    if kind == "graph_module":
        gm, codes = data
        # Rebuilt node by node, it and each region body in it must print the code that was compiled.
        if _torch.graph_codes(gm) != codes:
            raise CorruptEntry("a stored graph reloads to other code")
        return gm.forward
    if kind == "loader":
        loader, payload = data
        module_name, _, attr = loader.partition(":")
        return getattr(importlib.import_module(module_name), attr)(payload)
    raise CorruptEntry(f"unknown callable kind {kind!r}")


@dataclass
class CompileCache:
    """The cache as one compile sees it: its folder, key and whether it may read."""

    directory: Path
    key: str
    readable: bool

    @classmethod
    def for_compile(cls, pipeline: Pipeline, program: Program, *, plugins: Iterable[str] = ()) -> CompileCache | None:
        """The cache for compiling ``program`` with ``pipeline``; None with ``cache = "off"`` or
        when the folder is refused (not private to the user: one warning line says why)."""
        if not cache_enabled(pipeline):
            return None
        directory = usable_cache_dir()
        if directory is None:
            return None
        try:
            key = cache_key(pipeline, program, plugins=plugins)
        except Exception as exc:  # noqa: BLE001 - a program we cannot key compiles uncached
            log.info("passkit: not caching: cannot compute the key (%s)", type(exc).__name__)
            return None
        return cls(directory, key, _readable(pipeline))

    @property
    def path(self) -> Path:
        return self.directory / f"{self.key}{SUFFIX}"

    def load(self, program: Program) -> Report | None:
        """Fill ``program`` in place from the entry and return its report marked as a hit, with
        the time this load took; None when there is no entry (or it was corrupt, and is now
        deleted), or when it was compiled under shape guards the program's sizes fail."""
        if not self.readable:
            return None
        started = time.perf_counter()
        try:
            blob = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("passkit: cannot read cache entry %s (%s); compiling", self.path, exc)
            return None
        try:
            entry = _torch.loads_graphs(_decode(blob))
            if not isinstance(entry, dict) or entry.get("key") != self.key:
                raise CorruptEntry("the entry's key does not match its file name")
        except Exception as exc:  # noqa: BLE001 - any failure to load means a bad entry
            self._drop(exc)
            return None
        # Before loading the code: the guards its compile added must hold for these sizes, and
        # the caller must check them from now on, as it would had this process compiled it.
        if not _torch.install_shape_guards(program.example_inputs, entry.get("shape_guards", [])):
            log.info("passkit: cache entry %s was compiled under shape guards these sizes fail; compiling", self.path.name)
            return None
        try:
            compiled = {name: _load_callable(stored) for name, stored in entry["compiled"].items()}
        except Exception as exc:  # noqa: BLE001 - any failure to load means a bad entry
            self._drop(exc)
            return None
        program.graphs = entry["graphs"]
        program.signature = entry["signature"]
        program.facts = set(entry["facts"])
        program.compiled = compiled
        touch(self.path)
        report: Report = entry["report"]
        report.cache = "hit"
        report.load_seconds = time.perf_counter() - started
        return report

    def _drop(self, exc: BaseException) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.warning("passkit: cache entry %s is corrupt (%s); deleted it, compiling again", self.path.name, reason)

    def store(self, program: Program, report: Report) -> bool:
        """Write the compiled program and its report; False when a callable cannot be stored."""
        stored = {}
        for name, fn in program.compiled.items():
            found = _store_callable(fn)
            if found is None:
                log.info("passkit: not caching: graph %r's compiled callable has no cache form", name)
                return False
            stored[name] = found
        entry = {
            "format": FORMAT,
            "key": self.key,
            "graphs": dict(program.graphs),
            "signature": program.signature,
            "facts": sorted(program.facts),
            "compiled": stored,
            "shape_guards": _torch.shape_guards(program.example_inputs),
            "report": dataclasses.replace(report, cache=""),
        }
        try:
            payload = _torch.dumps_graphs(entry)
        except Exception as exc:  # noqa: BLE001 - an unpicklable graph attribute: skip, never fail
            log.info("passkit: not caching: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return False
        try:
            blob = _encode(payload)
            write_atomically(self.path, blob)
            evicted = after_write(self.directory, self.path, len(blob))
        except OSError as exc:
            log.warning("passkit: cannot write cache entry %s (%s)", self.path, exc)
            return False
        if evicted:
            log.info("passkit: evicted %d least recently used cache entr%s to stay under the size limit",
                     len(evicted), "y" if len(evicted) == 1 else "ies")
        return True
