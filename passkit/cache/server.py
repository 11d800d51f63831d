"""Own the compile cache's server: Redis (or Valkey) at ``PASSKIT_CACHE_URL``, as a store
(``passkit.cache.stores``) layered behind the folder, and what ``passkit cache info`` says of it.

- entries are the keys ``passkit:entry:<key>``, holding an entry's bytes (``passkit.cache.entry``);
  a ``SET`` replaces a key whole, so two writers of one key leave one valid entry. The server's
  own eviction (``maxmemory-policy``) may drop any of them: a dropped entry is a miss;
- a lease is the key ``passkit:lease:<key>``, set with ``SET NX PX`` to this process's
  ``host:pid`` for ``lease_seconds()`` (``PASSKIT_CACHE_LEASE_SECONDS``, default 30). A thread
  renews it every third of that while the compile runs; extending and releasing check the owner
  first in one Lua script, so a process never extends or deletes another's lease. A holder that
  dies stops renewing, and the lease expires: a waiter then takes it and compiles;
- a holder that lets go publishes its ``host:pid`` on the channel ``passkit:done:<key>``. Its
  waiters subscribe to it while they wait (``watch``), so they look for the entry the moment
  it is there, and otherwise only every ``RECHECK_S``, for a lease whose holder died: a node's
  waiters cost the server almost nothing however long the compile takes;
- the server is read only when the process trusts keys (``PASSKIT_CACHE_TRUSTED_KEYS``):
  whoever can write the server could otherwise run code in every reader. Without them it is
  written, never read, and ``unreadable`` says why. It is written only by a process that signs
  (``PASSKIT_CACHE_SIGNING_KEY``): no reader loads an unsigned entry, and writing one would
  replace a signed entry of the same key;
- a server that cannot be reached, at the start or in the middle of a run, costs one warning
  line; from then on this process uses the folder alone (no second timeout per compile).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

from passkit.cache.stores import FOLDER_POLL_S, GAVE_UP_SECONDS, Lease, owner_name
from passkit.errors import PasskitError

__all__ = ["URL_ENV", "LEASE_ENV", "ServerStore", "ServerInfo", "server_url", "lease_seconds", "server_info"]

URL_ENV = "PASSKIT_CACHE_URL"
LEASE_ENV = "PASSKIT_CACHE_LEASE_SECONDS"
ENTRY_PREFIX = "passkit:entry:"
LEASE_PREFIX = "passkit:lease:"
GAVE_UP_PREFIX = "passkit:gaveup:"
DONE_PREFIX = "passkit:done:"
RECHECK_S = 1.0  # a waiter that heard nothing looks again: its holder may have died
CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 30.0  # a large entry over a slow link

log = logging.getLogger("passkit.cache")

# Extend or delete a lease only while it is still ours.
_EXTEND = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


def server_url() -> str | None:
    """``PASSKIT_CACHE_URL`` (``redis://host:port/db``), or None when unset."""
    return os.environ.get(URL_ENV, "").strip() or None


def lease_seconds() -> float:
    configured = os.environ.get(LEASE_ENV, "").strip()
    try:
        seconds = float(configured) if configured else 30.0
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise PasskitError(f"{LEASE_ENV}: expected a positive number of seconds, got {configured!r}")
    return seconds


def _client(url: str) -> Any:
    try:
        import redis
    except ImportError:
        raise PasskitError(f"{URL_ENV} is set but the 'redis' package is not installed (pip install 'passkit[cluster]')") from None
    try:
        return redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S)
    except ValueError as exc:
        raise PasskitError(f"{URL_ENV}: {exc}") from None


def _close(subscribed: Any) -> None:
    with contextlib.suppress(Exception):  # the server may be gone: nothing to tidy there
        subscribed.close()


def _reason(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class _ServerLease:
    """A lease key this process holds, renewed by a daemon thread until ``release``."""

    def __init__(self, store: ServerStore, key: str, owner: str, ttl_ms: int) -> None:
        self.store, self.key, self.name, self.owner, self.ttl_ms = store, key, LEASE_PREFIX + key, owner, ttl_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"passkit-lease-{key[-8:]}", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_ms / 3000):
            if self.store.call(lambda c: c.eval(_EXTEND, 1, self.name, self.owner, self.ttl_ms)) is None:
                return  # the server went away: waiters fall back to compiling

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        self.store.call(lambda c: c.eval(_RELEASE, 1, self.name, self.owner))
        self.store.call(lambda c: c.publish(DONE_PREFIX + self.key, self.owner))


class ServerStore:
    """A Redis server as a store. Every call that fails to reach it warns once, then the store
    answers as an empty, lease-less one for the rest of the process."""

    name = "server"

    def __init__(self, url: str, *, readable: bool, unreadable: str = "", writable: bool = True) -> None:
        self.url = url
        self.readable, self.writable = readable, writable
        self.unreadable = unreadable  # why it is not read, for ``cache info``
        self.client = _client(url)
        self.down = False
        self._lock = threading.Lock()

    def call(self, operation: Any) -> Any:
        """``operation(client)``, or None once the server is unreachable (one warning line)."""
        import redis

        if self.down:
            return None
        try:
            return operation(self.client)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            with self._lock:
                if not self.down:
                    self.down = True
                    log.warning("passkit: cache server %s is unreachable (%s); going on with the cache folder alone",
                                self.url, _reason(exc))
            return None
        except redis.exceptions.RedisError as exc:  # the server answered with an error (out of memory, read-only replica)
            log.warning("passkit: cache server %s refused a request (%s)", self.url, _reason(exc))
            return None

    def get(self, key: str) -> bytes | None:
        return self.call(lambda c: c.get(ENTRY_PREFIX + key))

    def put(self, key: str, blob: bytes) -> None:
        self.call(lambda c: c.set(ENTRY_PREFIX + key, blob))

    def drop(self, key: str) -> None:
        self.call(lambda c: c.delete(ENTRY_PREFIX + key))

    def give_up(self, key: str) -> None:
        self.call(lambda c: c.set(GAVE_UP_PREFIX + key, repr(time.time()), ex=GAVE_UP_SECONDS))

    def gave_up(self, key: str) -> float:
        when = self.call(lambda c: c.get(GAVE_UP_PREFIX + key))
        try:
            return float(when) if when else 0.0
        except ValueError:
            return 0.0

    def claim(self, key: str) -> Lease | str | None:
        name, owner, ttl_ms = LEASE_PREFIX + key, owner_name(), int(lease_seconds() * 1000)
        for _ in range(3):  # a lease that expires between SET and GET: ask again
            if self.call(lambda c: c.set(name, owner, nx=True, px=ttl_ms)):
                return _ServerLease(self, key, owner, ttl_ms)
            if self.down:
                return None
            holder = self.call(lambda c: c.get(name))
            if holder is not None:
                return holder.decode(errors="replace")
        return None

    @contextlib.contextmanager
    def watch(self, key: str) -> Iterator[Callable[[float], None]]:
        """Subscribed to the key's channel for the waiter's whole wait, so that a holder letting
        go between two checks is still heard. A subscription that breaks leaves polling; whether
        the server itself is gone, the waiter's next request says (one line)."""
        import redis

        def subscribe(client: Any) -> Any:
            subscribed = client.pubsub(ignore_subscribe_messages=True)
            subscribed.subscribe(DONE_PREFIX + key)
            return subscribed

        channel = self.call(subscribe)

        def wait(seconds: float) -> None:
            nonlocal channel
            seconds = max(0.0, seconds)
            if channel is not None and not self.down:
                try:
                    channel.get_message(timeout=min(seconds, RECHECK_S))
                    return
                except (redis.exceptions.RedisError, OSError):
                    _close(channel)
                    channel = None
            time.sleep(min(seconds, FOLDER_POLL_S))

        try:
            yield wait
        finally:
            if channel is not None:
                _close(channel)


@dataclass
class ServerInfo:
    """What ``passkit cache info`` shows of the server."""

    url: str
    reachable: bool
    entries: int | None
    bytes: int | None
    read: bool  # whether compiles load entries from it
    why_not_read: str = ""
    written: bool = True  # whether compiles write their entries to it
    why_not_written: str = ""
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def server_info(url: str, *, readable: bool, unreadable: str = "", unwritable: str = "") -> ServerInfo:
    """Count the server's entries and their bytes (``SCAN`` and ``STRLEN``)."""
    import redis

    client = _client(url)
    try:
        count = size = 0
        keys = list(client.scan_iter(match=ENTRY_PREFIX + "*", count=1000))
        if keys:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.strlen(key)
            lengths = pipe.execute()
            count, size = sum(1 for n in lengths if n), sum(lengths)
    except redis.exceptions.RedisError as exc:
        return ServerInfo(url, False, None, None, readable, unreadable, not unwritable, unwritable, _reason(exc))
    finally:
        client.close()
    return ServerInfo(url, True, count, size, readable, unreadable, not unwritable, unwritable)
