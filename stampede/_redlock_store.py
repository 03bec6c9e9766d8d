"""A layer's store whose leases are Redlock leases: held on a majority of independent
lock servers, while values, messages and the stale-write guard stay on the cache server.

A load's lease is held in two places, for two reasons:

* on a majority of the lock servers, so that no two loads of a key run at once even
  when the cache server loses its keys (a restart, a failover that lost the last
  writes): a second loader waits for the first, however the cache fares;
* as the usual lock key on the cache server, so that the write stays one atomic
  compare-and-write there. An invalidation deletes that key (and drops the lease on the
  lock servers, so a waiter takes over at once); the holder's write is then refused,
  exactly as in a layer without Redlock. Nothing stale is written after an invalidation.

The order of the steps is what keeps waiters from missing a wake-up:

* take: the majority first, then the cache key with the value's double-check; a refused
  majority is followed by a read of the value, because a holder writes (and wakes its
  waiters) before it releases the majority;
* write: on the cache server (waking the waiters with the value), then release the
  majority; release without a write: the majority first, then the cache key, whose
  message wakes the waiters to take it;
* invalidate: drop the majority first, then the value and the cache key, whose message
  wakes the waiters.

Fair named locks and fencing stay single-server: ``layer.lock()`` on such a layer lives
on the cache server, as ``RedlockLock`` (``Redlock.lock``) lives on the lock servers.
"""

from __future__ import annotations

import time
from typing import Callable

from ._anotify import AsyncSubscription
from ._errors import BackendUnavailable
from ._flow import AcquireReply, LockState, Written
from ._keys import EntryKeys
from ._notify import Subscription
from ._redlock import AsyncLockServers, LockServers, Quorum, renew_majority, take_majority
from ._steps import Step, Steps, arun, run
from ._store import AsyncStore, Store


class RedlockLeases:
    """The decisions of a store with Redlock leases, as steps on ``cache.*`` (the cache
    server's store) and ``servers.*`` (the lock servers). Pure: no I/O."""

    def __init__(self, quorum: Quorum, clock: Callable[[], float] = time.monotonic) -> None:
        self.quorum = quorum
        self.clock = clock

    def acquire(self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool) -> Steps[AcquireReply]:
        quorum, on_servers = self.quorum, keys.on_lock_servers
        taken, valid_until = yield from take_majority(quorum, on_servers, token, lease_ms, "servers.", self.clock)
        if valid_until is not None:
            try:
                reply: AcquireReply = yield Step("cache.acquire", (keys, token, lease_ms, check_value))
            except BaseException:
                yield Step("servers.release", (on_servers, token))
                raise
            if reply.state is not LockState.LOCKED:  # the value is there, or a lapsed holder's key
                yield Step("servers.release", (on_servers, token))
            return reply
        if not quorum.reachable(taken):
            raise BackendUnavailable(
                f"only {quorum.size - taken.failed} of {quorum.size} lock servers answered for {keys.value!r}; "
                f"a lease needs {quorum.needed}",
                key=keys.value,
            )
        if check_value:
            raw = yield Step("cache.get", (keys.value,))
            if raw is not None:
                return AcquireReply(LockState.VALUE, raw)
        return AcquireReply(LockState.HELD, lease_left=taken.lease_left)

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Steps[bool]:
        """Renewed while a majority renews in time. The cache key is renewed too, best
        effort: without it the write is refused, but the majority keeps other loads out
        until this one ends."""
        quorum, on_servers = self.quorum, keys.on_lock_servers
        renewed, valid_until = yield from renew_majority(quorum, on_servers, token, lease_ms, "servers.", self.clock)
        if valid_until is None:
            if not quorum.reachable(renewed):
                raise BackendUnavailable(
                    f"only {quorum.size - renewed.failed} of {quorum.size} lock servers answered "
                    f"to renew the lease of {keys.value!r}",
                    key=keys.value,
                )
            return False
        try:
            yield Step("cache.renew", (keys, token, lease_ms))
        except BackendUnavailable:
            pass
        return True

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool
    ) -> Steps[Written]:
        on_servers = keys.on_lock_servers
        try:
            written: Written = yield Step("cache.write_release", (keys, token, envelope, ttl_ms, inline))
        finally:
            yield Step("servers.release", (on_servers, token))
        return written

    def release(self, keys: EntryKeys, token: str) -> Steps[bool]:
        on_servers = keys.on_lock_servers
        yield Step("servers.release", (on_servers, token))
        released: bool = yield Step("cache.release", (keys, token))
        return released

    def invalidate(self, keys: EntryKeys) -> Steps[None]:
        on_servers = keys.on_lock_servers
        yield Step("servers.drop", (on_servers,))
        yield Step("cache.invalidate", (keys,))


class RedlockStore:
    """A ``Store``: the cache server's store, with leases also held on lock servers."""

    def __init__(self, cache: Store, servers: LockServers, quorum: Quorum) -> None:
        self.cache = cache
        self.servers = servers
        self._leases = RedlockLeases(quorum)

    def get(self, key: str) -> bytes | None:
        return self.cache.get(key)

    def acquire(self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool) -> AcquireReply:
        return run(self._leases.acquire(keys, token, lease_ms, check_value), self)

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return run(self._leases.renew(keys, token, lease_ms), self)

    def write_release(self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool) -> Written:
        return run(self._leases.write_release(keys, token, envelope, ttl_ms, inline), self)

    def release(self, keys: EntryKeys, token: str) -> bool:
        return run(self._leases.release(keys, token), self)

    def invalidate(self, keys: EntryKeys) -> None:
        run(self._leases.invalidate(keys), self)

    # Named locks, their queues and messages: the cache server's (see the module).

    def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        return self.cache.take_lock(keys, token, lease_ms, queue_ms)

    def leave_queue(self, keys: EntryKeys, token: str) -> None:
        self.cache.leave_queue(keys, token)

    def holder(self, keys: EntryKeys) -> str | None:
        return self.cache.holder(keys)

    def subscribe(self, keys: EntryKeys) -> Subscription:
        return self.cache.subscribe(keys)

    def check(self, namespace: str) -> None:
        self.cache.check(namespace)

    def scan(self, namespace: str) -> set[str]:
        return self.cache.scan(namespace)

    def close(self) -> None:
        self.cache.close()  # the lock servers' clients are the Redlock manager's


class AsyncRedlockStore:
    """An ``AsyncStore``: ``RedlockStore`` for the tasks of one event loop. Owns its lock
    servers' clients."""

    def __init__(self, cache: AsyncStore, servers: AsyncLockServers, quorum: Quorum) -> None:
        self.cache = cache
        self.servers = servers
        self._leases = RedlockLeases(quorum)

    async def get(self, key: str) -> bytes | None:
        return await self.cache.get(key)

    async def acquire(self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool) -> AcquireReply:
        return await arun(self._leases.acquire(keys, token, lease_ms, check_value), self)

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return await arun(self._leases.renew(keys, token, lease_ms), self)

    async def write_release(self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool) -> Written:
        return await arun(self._leases.write_release(keys, token, envelope, ttl_ms, inline), self)

    async def release(self, keys: EntryKeys, token: str) -> bool:
        return await arun(self._leases.release(keys, token), self)

    async def invalidate(self, keys: EntryKeys) -> None:
        await arun(self._leases.invalidate(keys), self)

    async def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        return await self.cache.take_lock(keys, token, lease_ms, queue_ms)

    async def leave_queue(self, keys: EntryKeys, token: str) -> None:
        await self.cache.leave_queue(keys, token)

    async def holder(self, keys: EntryKeys) -> str | None:
        return await self.cache.holder(keys)

    async def subscribe(self, keys: EntryKeys) -> AsyncSubscription:
        return await self.cache.subscribe(keys)

    async def check(self, namespace: str) -> None:
        await self.cache.check(namespace)

    async def scan(self, namespace: str) -> set[str]:
        return await self.cache.scan(namespace)

    async def aclose(self) -> None:
        try:
            await self.cache.aclose()
        finally:
            await self.servers.aclose()
