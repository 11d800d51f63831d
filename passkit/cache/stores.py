"""Own where compile-cache entries live: one store interface, the folder that implements it,
and the layering of several stores (the folder first, then a server: ``passkit.cache.server``).

A store holds entries' bytes (``passkit.cache.entry``) under their keys and answers one question
for a compile that missed: "may I compile this key, or whom do I wait for?" (``claim``). The
answer is a ``Lease`` this process holds until it has stored the entry, or the name
(``host:pid``) of the process that holds it. A compile never knows which store answered:
``Layered`` asks the widest store that is readable (the server, reaching every machine, else
the folder, reaching this machine's processes).

The folder's lease is a lock file ``<key>.lock`` beside the entry, locked with ``flock``: the
kernel lets it go when its holder exits or dies, so a waiter takes over at once. The holder
writes its ``host:pid`` into the file for the waiters' progress line. Releasing unlinks the file
before unlocking it; a process that locks an unlinked file, or a new one made meanwhile, checks
the stores again before compiling and finds the entry (the same check every claimer makes).
Without ``fcntl`` (Windows) the folder has no lease: every process that misses compiles.

A holder whose compile ends without an entry (it failed, or its code has no cache form) says so
(``give_up``: a file ``<key>.gaveup``, or a server key, with the time) before it lets go, so
that the processes that were waiting then compile at once, together, instead of taking the lease
one after another. A waiter heeds only a give-up newer than its own wait.

A waiter sleeps between its checks in the claiming store's ``watch``: the folder's sleeps
``FOLDER_POLL_S``; the server's returns as soon as the holder lets go (it publishes that), so
waiters neither poll the server nor sit idle after the entry is there.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Protocol, runtime_checkable

from passkit.cache.folder import SUFFIX, TEMP_SUFFIX, after_write, touch

__all__ = ["Lease", "Store", "FolderStore", "Layered", "owner_name", "write_atomically", "polling",
           "LOCK_SUFFIX", "GAVE_UP_SECONDS", "FOLDER_POLL_S"]

FOLDER_POLL_S = 0.2  # a lock file says nothing when it goes: a waiter looks again this often
LOCK_SUFFIX = ".lock"
GAVE_UP_SUFFIX = ".gaveup"
GAVE_UP_SECONDS = 600  # how long the server keeps a give-up (the folder's file stays, dated)


def owner_name() -> str:
    """This process as waiters see it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@runtime_checkable
class Lease(Protocol):
    """A key this process may compile; others wait for it until ``release``."""

    def release(self) -> None: ...


class Store(Protocol):
    """Entries' bytes under their keys, and the leases of the keys being compiled."""

    name: str  # "folder" or "server": what a hit's report names
    readable: bool  # False: never read (a server without trusted keys)
    writable: bool  # False: never written (a server without a signing key)

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, blob: bytes) -> None: ...

    def drop(self, key: str) -> None: ...

    def claim(self, key: str) -> Lease | str | None:
        """A lease on ``key``, or who holds it; None when this store cannot lease (now)."""
        ...

    def give_up(self, key: str) -> None:
        """Note, with the time, that a compile of ``key`` ended without an entry."""
        ...

    def gave_up(self, key: str) -> float:
        """When (``time.time()``) a compile of ``key`` last gave up, or 0.0."""
        ...

    def watch(self, key: str) -> ContextManager[Callable[[float], None]]:
        """A ``wait(seconds)`` for a waiter on ``key``: sleeps at most ``seconds``, and may
        return sooner (when the key's holder lets go, or to look again)."""
        ...


@contextlib.contextmanager
def polling(interval: float) -> Iterator[Callable[[float], None]]:
    """A ``watch`` that sleeps ``interval`` at most: for a store that cannot say when a lease goes."""
    yield lambda seconds: time.sleep(max(0.0, min(seconds, interval)))


def write_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:16]}.", suffix=TEMP_SUFFIX)
    try:
        if mode != 0o600:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


class _LockFile:
    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    def release(self) -> None:
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self.fd)  # closing lets the lock go
        self.fd = -1


class FolderStore:
    """Entries as files ``<key>.entry`` in a folder; leases as locked ``<key>.lock`` files.
    A ``shared`` folder (the group's) gets group-readable entries and group-lockable leases."""

    name = "folder"
    readable = writable = True

    def __init__(self, directory: Path, *, shared: bool = False) -> None:
        self.directory = Path(directory)
        self.shared = shared
        self.evicted: list[Path] = []  # what the last ``put`` evicted to stay under the size limit

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def get(self, key: str) -> bytes | None:
        try:
            blob = self.path(key).read_bytes()
        except FileNotFoundError:
            return None
        touch(self.path(key))  # a use: least recently used entries are evicted first
        return blob

    def put(self, key: str, blob: bytes) -> None:
        write_atomically(self.path(key), blob, 0o640 if self.shared else 0o600)
        self.evicted = after_write(self.directory, self.path(key), len(blob))

    def drop(self, key: str) -> None:
        with contextlib.suppress(OSError):
            self.path(key).unlink()

    def give_up(self, key: str) -> None:
        with contextlib.suppress(OSError):
            (self.directory / f"{key}{GAVE_UP_SUFFIX}").touch()

    def gave_up(self, key: str) -> float:
        try:
            return (self.directory / f"{key}{GAVE_UP_SUFFIX}").stat().st_mtime
        except OSError:
            return 0.0

    def claim(self, key: str) -> Lease | str | None:
        try:
            import fcntl
        except ImportError:
            return None
        path = self.directory / f"{key}{LOCK_SUFFIX}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o660 if self.shared else 0o600)
        except OSError:
            return None  # a read-only folder: no lease, compile
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip()
            os.close(fd)
            return holder or "another process"
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner_name().encode(), 0)
        return _LockFile(fd, path)

    def watch(self, key: str) -> ContextManager[Callable[[float], None]]:
        return polling(FOLDER_POLL_S)


class Layered:
    """Stores looked in one after the other (the folder first); what is written goes to all."""

    def __init__(self, stores: list[Store]) -> None:
        self.stores = stores

    def get(self, key: str) -> tuple[bytes, Store] | None:
        for store in self.stores:
            if store.readable:
                blob = store.get(key)
                if blob is not None:
                    return blob, store
        return None

    def put(self, key: str, blob: bytes, *, skip: Store | None = None) -> None:
        """Write to every store but ``skip`` (the one the entry came from); a failing folder
        raises ``OSError``, a failing server has warned and gone quiet."""
        for store in self.stores:
            if store.writable and store is not skip:
                store.put(key, blob)

    def give_up(self, key: str) -> None:
        for store in self.stores:
            store.give_up(key)

    def gave_up(self, key: str) -> float:
        return max([store.gave_up(key) for store in self.stores if store.readable], default=0.0)

    def watch(self, key: str) -> ContextManager[Callable[[float], None]]:
        """The widest readable store's ``watch``: the store a waiter's ``claim`` asks first."""
        readable = [store for store in self.stores if store.readable]
        return readable[-1].watch(key) if readable else polling(FOLDER_POLL_S)

    def claim(self, key: str) -> Lease | str | None:
        """Ask the widest readable store that can lease; None when none can."""
        for store in reversed(self.stores):
            if store.readable:
                answer = store.claim(key)
                if answer is not None:
                    return answer
        return None
