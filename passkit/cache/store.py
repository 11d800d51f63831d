"""Own the compile cache as one compile sees it: what an entry holds, loading it (or waiting for
the process compiling it), and storing it.

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

An entry (``passkit.cache.entry``: checksum, ed25519 signature, payload) lives in the stores of
``passkit.cache.stores``: the folder ``cache_dir()`` (``PASSKIT_CACHE_DIR``, else the user cache
directory), then, with ``PASSKIT_CACHE_URL``, a Redis server (``passkit.cache.server``). A
compile looks in the folder, then on the server (a server hit is copied into the folder), and
writes what it compiles to both. The payload is the pickled entry (final graphs, signature,
facts, compiled callables, report). An entry that fails its checks (truncated, corrupted,
unloadable) is deleted with one warning line and the program is compiled again; one that this
process must not trust (``PASSKIT_CACHE_TRUSTED_KEYS``: unsigned, signed by another key, altered)
gets one line, is kept, and is a miss. Its signature is checked before it is unpickled.

A miss asks the stores for the key's lease (``Layered.claim``). The holder compiles, stores and
releases; the others wait, with a progress line every ``WAIT_LINE_EVERY_S`` naming whom they
wait for, and load the entry when it appears. A waiter whose holder died (its lease expired or
its lock went with it) takes the lease and compiles; none waits longer than ``[settings]
cache_wait`` (seconds, default 600) before compiling itself.
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

The folder must be private to the user (``passkit.cache.folder.usable_cache_dir``), unless the
process trusts keys (then each entry proves who made it, and a folder the group can write, or
another user's, is accepted): a refused folder is neither read nor written.
Entries are only read when the run does not watch its steps (``verify`` and ``dump`` off), since
a hit runs no step; they are written whenever ``cache = "on"``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable


from passkit import _torch
from passkit.cache.callables import load_callable, store_callable
from passkit.cache.entry import CorruptEntry, UntrustedEntry, decode, encode
from passkit.cache.folder import CACHE_ENV, SUFFIX, CacheInfo, cache_dir, cache_info, clear_cache, usable_cache_dir
from passkit.cache.key import FORMAT, cache_key, global_settings, plan_digest
from passkit.cache.server import ServerStore, server_url
from passkit.cache.signing import SIGNING_KEY_ENV, TRUSTED_KEYS_ENV, signing_key, trusted_keys
from passkit.cache.stores import FolderStore, Layered, Lease, Store
from passkit.core.progress import ProgressEvent, send

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
    "open_stores",
    "server_unreadable",
    "server_unwritable",
]

WAIT_LINE_EVERY_S = 10.0

log = logging.getLogger("passkit.cache")
_refused: set[tuple[str, str]] = set()  # (key, reason) lines this process already wrote
_servers: dict[tuple[str, bool, bool], ServerStore] = {}  # one per URL and process: it remembers being down


def cache_enabled(pipeline: Pipeline) -> bool:
    """Whether the pipeline's settings let the cache be written (``cache = "on"``)."""
    return getattr(pipeline.settings, "cache", "off") == "on"


def _readable(pipeline: Pipeline) -> bool:
    settings = pipeline.settings
    return cache_enabled(pipeline) and settings.verify == "off" and settings.dump == "off"


def server_unreadable(trusted: frozenset[bytes] | None) -> str:
    """Why the server is not read, or "" when it is read."""
    if trusted:
        return ""
    return f"{TRUSTED_KEYS_ENV} is not set, and a server entry is loaded only when a trusted key signed it"


def server_unwritable(signs: bool) -> str:
    """Why the server is not written, or "" when it is: an unsigned entry is one no reader loads,
    and it would replace a signed one."""
    if signs:
        return ""
    return f"{SIGNING_KEY_ENV} is not set, and no reader loads an unsigned entry from the server"


def open_stores(trusted: frozenset[bytes] | None) -> Layered | None:
    """The folder (when not refused), then the server (with ``PASSKIT_CACHE_URL``); None when
    neither is usable."""
    stores: list[Store] = []
    directory = usable_cache_dir(shared=bool(trusted))
    if directory is not None:
        stores.append(FolderStore(directory, shared=bool(trusted)))
    url = server_url()
    if url is not None:
        why, signs = server_unreadable(trusted), signing_key() is not None
        if (url, not why, signs) not in _servers:
            _servers[(url, not why, signs)] = ServerStore(url, readable=not why, unreadable=why, writable=signs)
        stores.append(_servers[(url, not why, signs)])
    return Layered(stores) if stores else None


@dataclass
class CompileCache:
    """The cache as one compile sees it: its stores, key, whether it may read, the keys it
    trusts, how long it waits for another process's compile, and the lease it holds."""

    stores: Layered
    key: str
    readable: bool
    trusted: frozenset[bytes] | None = None
    wait_seconds: float = 600.0
    lease: Lease | None = field(default=None, repr=False)

    @classmethod
    def for_compile(cls, pipeline: Pipeline, program: Program, *, plugins: Iterable[str] = ()) -> CompileCache | None:
        """The cache for compiling ``program`` with ``pipeline``; None with ``cache = "off"`` or
        when no store is usable (a refused folder and no server: one warning line says why)."""
        if not cache_enabled(pipeline):
            return None
        trusted = trusted_keys() or None
        stores = open_stores(trusted)
        if stores is None:
            return None
        try:
            key = cache_key(pipeline, program, plugins=plugins)
        except Exception as exc:  # noqa: BLE001 - a program we cannot key compiles uncached
            log.info("passkit: not caching: cannot compute the key (%s)", type(exc).__name__)
            return None
        return cls(stores, key, _readable(pipeline), trusted, float(getattr(pipeline.settings, "cache_wait", 600.0)))

    def _name(self, store: Store) -> str:
        return f"{self.key}{SUFFIX}" + ("" if store.name == "folder" else f" on the {store.name}")

    def load(self, program: Program) -> Report | None:
        """Fill ``program`` in place from the entry and return its report marked as a hit (and
        where the entry came from), with the time this load took; None when there is no entry,
        it was corrupt (and is now deleted), untrusted, or compiled under shape guards the
        program's sizes fail."""
        if not self.readable:
            return None
        started = time.perf_counter()
        try:
            found = self.stores.get(self.key)
        except OSError as exc:
            log.warning("passkit: cannot read cache entry %s (%s); compiling", self.key, exc)
            return None
        if found is None:
            return None
        blob, store = found
        try:
            decoded = decode(blob, self.key, self.trusted)  # before a byte is unpickled
            entry = _torch.loads_graphs(decoded.payload)
            if not isinstance(entry, dict) or entry.get("key") != self.key:
                raise CorruptEntry("the entry's key does not match its file name")
        except UntrustedEntry as exc:
            self._refuse(store, exc)
            return None
        except Exception as exc:  # noqa: BLE001 - any failure to load means a bad entry
            self._drop(store, exc)
            return None
        # Before loading the code: the guards its compile added must hold for these sizes, and
        # the caller must check them from now on, as it would had this process compiled it.
        if not _torch.install_shape_guards(program.example_inputs, entry.get("shape_guards", [])):
            log.info("passkit: cache entry %s was compiled under shape guards these sizes fail; compiling", self._name(store))
            return None
        try:
            compiled = {name: load_callable(stored) for name, stored in entry["compiled"].items()}
        except Exception as exc:  # noqa: BLE001 - any failure to load means a bad entry
            self._drop(store, exc)
            return None
        program.graphs = entry["graphs"]
        program.signature = entry["signature"]
        program.facts = set(entry["facts"])
        program.compiled = compiled
        if store is not self.stores.stores[0]:  # from the server: into the folder, for next time
            self._put(blob, skip=store)
        report: Report = entry["report"]
        report.cache = "hit"
        report.source = decoded.origin or store.name
        report.load_seconds = time.perf_counter() - started
        return report

    def _refuse(self, store: Store, exc: BaseException) -> None:
        if (self.key, str(exc)) not in _refused:  # a waiter polls: one line, not one per poll
            _refused.add((self.key, str(exc)))
            log.warning("passkit: not loading cache entry %s: %s; compiling", self._name(store), exc)

    def _drop(self, store: Store, exc: BaseException) -> None:
        store.drop(self.key)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.warning("passkit: cache entry %s is corrupt (%s); deleted it, compiling again", self._name(store), reason)

    def load_or_wait(self, program: Program, *, progress: Any = None, graph: str = "graph 1") -> Report | None:
        """``load``; on a miss, take the key's lease (then return None: this process compiles,
        stores and ``release``s) or wait for its holder's entry and load that. A holder that dies
        loses its lease and a waiter takes it; after ``wait_seconds`` a waiter compiles itself."""
        report = self.load(program)
        if report is not None or not self.readable or self.wait_seconds <= 0:
            return report
        started, since = time.monotonic(), time.time() - 1.0  # a file's time may be a little behind
        next_line = started
        with self.stores.watch(self.key) as wait:
            while True:
                answer = self.stores.claim(self.key)
                if not isinstance(answer, str):
                    self.lease = answer
                    if answer is not None:
                        report = self.load(program)  # the holder may have stored it just before letting go
                        if report is not None:
                            self.release()
                    return report
                waited = time.monotonic() - started
                if waited >= self.wait_seconds:
                    log.warning("passkit: waited %.0f s for %s to compile %s; compiling it here too ([settings] cache_wait)",
                                waited, answer, graph)
                    return None
                if time.monotonic() >= next_line:
                    send(progress, ProgressEvent("waiting", f"waiting for {answer} to compile {graph} ({waited:.0f} s) ...",
                                                 seconds=waited, graph=graph))
                    next_line += WAIT_LINE_EVERY_S
                wait(min(next_line, started + self.wait_seconds) - time.monotonic())
                report = self.load(program)
                if report is not None:
                    return report
                if self.stores.gave_up(self.key) >= since:
                    log.info("passkit: %s compiled %s without storing it; compiling it here too", answer, graph)
                    return None

    def release(self, stored: bool = True) -> None:
        """Let the waiters go: after ``store``, or, ``stored`` False, after a compile that failed
        or could not be stored (then the waiters compile at once, rather than one by one)."""
        lease, self.lease = self.lease, None
        if lease is not None:
            if not stored:
                self.stores.give_up(self.key)
            lease.release()

    def _put(self, blob: bytes, skip: Store | None = None) -> bool:
        try:
            self.stores.put(self.key, blob, skip=skip)
        except OSError as exc:
            log.warning("passkit: cannot write cache entry %s (%s)", self._name(self.stores.stores[0]), exc)
            return False
        evicted = [path for store in self.stores.stores for path in getattr(store, "evicted", [])]
        if evicted:
            log.info("passkit: evicted %d least recently used cache entr%s to stay under the size limit",
                     len(evicted), "y" if len(evicted) == 1 else "ies")
        return True

    def store(self, program: Program, report: Report) -> bool:
        """Write the compiled program and its report, signed when ``PASSKIT_CACHE_SIGNING_KEY``
        names a key; False when a callable cannot be stored."""
        stored = {}
        for name, fn in program.compiled.items():
            found = store_callable(fn)
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
            "report": dataclasses.replace(report, cache="", source=""),
        }
        try:
            payload = _torch.dumps_graphs(entry)
        except Exception as exc:  # noqa: BLE001 - an unpicklable graph attribute: skip, never fail
            log.info("passkit: not caching: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return False
        return self._put(encode(self.key, payload, signing_key()))
