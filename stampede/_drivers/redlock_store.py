"""A layer's store whose leases are Redlock leases: held on a majority of independent
lock servers, while values, messages and the stale-write guard stay on the cache server.

A load's lease is held in two places, for two reasons:

* on a majority of the lock servers, so that no two loads of a key run at once even
  when the cache server loses its keys (a restart, a failover that lost the last
  writes): a second loader waits for the first, however the cache fares.
* as the usual lock key on the cache server, so that the write stays one atomic
  compare-and-write there. An invalidation deletes that key (and drops the lease on the
  lock servers, so a waiter takes over at once). The holder's write is then refused,
  exactly as in a layer without Redlock. Nothing stale is written after an invalidation.

ZooKeeper leases (``ZooKeeperStore``) take the same shape with a session's rules
(``_core.sessions.SessionLeases``): the ensemble is one lock service, and a waiter also
watches the holder's node, so that a holder whose session ends is taken over at once.

The order of the steps is ``_core.majority.RedlockLeases``'s, written once. This module
performs it with ``_drivers.perform``, blocking or awaited. Fair named locks and fencing stay
single-server: ``layer.lock()`` on a Redlock layer lives on the cache server, as
``RedlockLock`` (``Redlock.lock``) lives on the lock servers. On a ZooKeeper layer it is
ZooKeeper's line beside the cache server's key (``_backends.zookeeper.locks``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

from .._core.effects import Decision, Lease
from .._core.keys import EntryKeys
from .._core.majority import Quorum, RedlockLeases
from .._core.sessions import SessionLeases
from .._core.store import (
    AcquireReply,
    AsyncLockServers,
    AsyncStore,
    AsyncSubscription,
    LockServers,
    Store,
    Subscription,
    Written,
)
from .perform import AsyncPerformer, Performer, arun, run

T = TypeVar("T")


class RedlockStore:
    """A ``Store``: the cache server's store, with leases also held on lock servers."""

    def __init__(self, cache: Store, servers: LockServers, quorum: Quorum, leases: RedlockLeases | None = None) -> None:
        self.cache = cache
        self.servers = servers
        self._leases = leases or RedlockLeases(quorum)

    def _run(self, decision: Decision[T], lease: Lease) -> T:
        return run(decision, Performer(lease, store=self.cache, servers=self.servers))

    def get(self, key: str) -> bytes | None:
        return self.cache.get(key)

    def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]:
        return self.cache.get_with_ttl(key, failing)

    def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b""
    ) -> AcquireReply:
        decision = self._leases.acquire(keys, token, lease_ms, check_value, stale)
        return self._run(decision, Lease(keys, token, lease_ms))

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return self._run(self._leases.renew(keys, token, lease_ms), Lease(keys, token))

    def write_release(self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool) -> Written:
        return self._run(self._leases.write_release(keys, token, envelope, ttl_ms, inline), Lease(keys, token))

    def release(self, keys: EntryKeys, token: str) -> bool:
        return self._run(self._leases.release(keys, token), Lease(keys, token))

    def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        return self._run(self._leases.hold(keys, token, hold_ms, failing_ms), Lease(keys, token))

    def invalidate(self, keys: EntryKeys) -> None:
        self._run(self._leases.invalidate(keys), Lease(keys))

    def expire(self, keys: EntryKeys) -> None:
        self._run(self._leases.expire(keys), Lease(keys))

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

    def scan(self, namespace: str, match: str = "*") -> set[str]:
        return self.cache.scan(namespace, match)

    def close(self) -> None:
        self.cache.close()  # the lock servers' clients are the Redlock manager's


class AsyncRedlockStore:
    """An ``AsyncStore``: ``RedlockStore`` for the tasks of one event loop. Owns its lock
    servers' clients."""

    def __init__(
        self, cache: AsyncStore, servers: AsyncLockServers, quorum: Quorum, leases: RedlockLeases | None = None
    ) -> None:
        self.cache = cache
        self.servers = servers
        self._leases = leases or RedlockLeases(quorum)

    async def _run(self, decision: Decision[T], lease: Lease) -> T:
        return await arun(decision, AsyncPerformer(lease, store=self.cache, servers=self.servers))

    async def get(self, key: str) -> bytes | None:
        return await self.cache.get(key)

    async def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]:
        return await self.cache.get_with_ttl(key, failing)

    async def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b""
    ) -> AcquireReply:
        decision = self._leases.acquire(keys, token, lease_ms, check_value, stale)
        return await self._run(decision, Lease(keys, token, lease_ms))

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return await self._run(self._leases.renew(keys, token, lease_ms), Lease(keys, token))

    async def write_release(self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool) -> Written:
        return await self._run(self._leases.write_release(keys, token, envelope, ttl_ms, inline), Lease(keys, token))

    async def release(self, keys: EntryKeys, token: str) -> bool:
        return await self._run(self._leases.release(keys, token), Lease(keys, token))

    async def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        return await self._run(self._leases.hold(keys, token, hold_ms, failing_ms), Lease(keys, token))

    async def invalidate(self, keys: EntryKeys) -> None:
        await self._run(self._leases.invalidate(keys), Lease(keys))

    async def expire(self, keys: EntryKeys) -> None:
        await self._run(self._leases.expire(keys), Lease(keys))

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

    async def scan(self, namespace: str, match: str = "*") -> set[str]:
        return await self.cache.scan(namespace, match)

    async def aclose(self) -> None:
        try:
            await self.cache.aclose()
        finally:
            await self.servers.aclose()


class Watchable(Protocol):
    def watch(self, keys: EntryKeys, wake: Callable[[], None]) -> None: ...


SESSION_QUORUM = Quorum(1, 0.0)  # one ensemble, whose leases have no term to drift


class ZooKeeperStore(RedlockStore):
    """A ``Store``: the cache server's store, with every load's lease also a ZooKeeper
    node. A waiter is woken by the holder's message or by its node's deletion."""

    session_leases = True  # a lease ends with its holder's session, not by a term

    def __init__(self, cache: Store, servers: LockServers, watcher: Watchable) -> None:
        super().__init__(cache, servers, SESSION_QUORUM, SessionLeases(SESSION_QUORUM))
        self._watcher = watcher

    def subscribe(self, keys: EntryKeys) -> Subscription:
        subscription = self.cache.subscribe(keys)
        deliver = getattr(subscription, "deliver", None)
        if deliver is not None:
            self._watcher.watch(keys.on_lock_servers, lambda: deliver(b""))
        return subscription


class AsyncZooKeeperStore(AsyncRedlockStore):
    """``ZooKeeperStore`` for the tasks of one event loop."""

    session_leases = True

    def __init__(self, cache: AsyncStore, servers: AsyncLockServers, watcher: Watchable) -> None:
        super().__init__(cache, servers, SESSION_QUORUM, SessionLeases(SESSION_QUORUM))
        self._watcher = watcher

    async def subscribe(self, keys: EntryKeys) -> AsyncSubscription:
        subscription = await self.cache.subscribe(keys)
        deliver = getattr(subscription, "deliver", None)
        if deliver is not None:
            await asyncio.to_thread(self._watcher.watch, keys.on_lock_servers, lambda: deliver(b""))
        return subscription
