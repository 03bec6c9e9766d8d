"""Named locks of a layer whose leases are ZooKeeper's: ``layer.lock(name)`` is a
ZooKeeper lock (fair, bound to the holder's session) with the zxid of the holder's node
as its fencing token, and the cache server's lease key beside it for the lease, the
watchdog and the release message, as for a load (``_core.sessions``).

Rules:

* Every ``Lock`` joins the line in ZooKeeper (``ZooKeeperQueue``). Only the first in line
  takes the cache server's key. A try that is not fair leaves the line at once when it is
  not first (a non-blocking acquire, or the next try of a plain blocking one).
* A release gives up the cache key first, then the node: whoever is first next finds the
  key free, so a key still held then is a holder whose session ended. It is taken over
  (compare-and-delete with that holder's token) at once.
* A waiter is woken by the release message on the cache server, or by the watch on the
  node before its own (``Wakers``: the mailboxes of this process on that lock).
* Renewal holds while our node exists and the cache key is ours.

The blocking and asyncio twins below are thin: the asyncio one runs each ZooKeeper step
in a worker thread (kazoo's calls block).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, Protocol

from ..._core.keys import EntryKeys
from ..._core.store import AcquireReply, AsyncStore, AsyncSubscription, LockState, Store, Subscription


class ZooKeeperQueue(Protocol):
    """Named locks' line in ZooKeeper (``_backends.zookeeper.servers.ZooKeeperQueue``)."""

    def enqueue(self, keys: EntryKeys, token: str) -> tuple[int, str | None]: ...

    def leave(self, keys: EntryKeys, token: str) -> None: ...

    def holds(self, keys: EntryKeys, token: str) -> bool: ...

    def watch(self, node: str, wake: Callable[[], None]) -> None: ...


class Wakers:
    """The mailboxes of this process waiting on each named lock, woken by a ZooKeeper
    watch (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, set[Callable[[bytes], None]]] = {}

    def add(self, channel: str, deliver: Callable[[bytes], None]) -> None:
        with self._lock:
            self._waiting.setdefault(channel, set()).add(deliver)

    def remove(self, channel: str, deliver: Callable[[bytes], None]) -> None:
        with self._lock:
            waiting = self._waiting.get(channel)
            if waiting is not None:
                waiting.discard(deliver)
                if not waiting:
                    del self._waiting[channel]

    def waker(self, channel: str) -> Callable[[], None]:
        def wake() -> None:
            with self._lock:
                waiting = list(self._waiting.get(channel, ()))
            for deliver in waiting:
                deliver(b"")

        return wake


class _Watched:
    """A subscription that also hears ZooKeeper watches until closed."""

    def __init__(self, subscription: Subscription, wakers: Wakers, channel: str) -> None:
        self._subscription = subscription
        self._deliver: Callable[[bytes], None] = getattr(subscription, "deliver")  # noqa: B009  (mailboxes have it)
        self._wakers, self._channel = wakers, channel
        wakers.add(channel, self._deliver)

    def wait(self, timeout: float) -> bytes | None:
        return self._subscription.wait(timeout)

    def close(self) -> None:
        self._wakers.remove(self._channel, self._deliver)
        self._subscription.close()


class _AsyncWatched:
    def __init__(self, subscription: AsyncSubscription, wakers: Wakers, channel: str) -> None:
        self._subscription = subscription
        self._deliver: Callable[[bytes], None] = getattr(subscription, "deliver")  # noqa: B009
        self._wakers, self._channel = wakers, channel
        wakers.add(channel, self._deliver)

    async def wait(self, timeout: float) -> bytes | None:
        return await self._subscription.wait(timeout)

    def close(self) -> None:
        self._wakers.remove(self._channel, self._deliver)
        self._subscription.close()


class ZooKeeperLockStore:
    """The ``Store`` of a ZooKeeper layer's named locks (only the named locks' methods
    differ from the cache server's, see the module)."""

    def __init__(self, cache: Store, queue: ZooKeeperQueue, wakers: Wakers) -> None:
        self.cache = cache
        self.queue = queue
        self.wakers = wakers

    def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        fence, before = self.queue.enqueue(keys, token)
        if before is not None:
            self.queue.watch(before, self.wakers.waker(keys.channel))
            if not queue_ms:
                self.queue.leave(keys, token)
            return AcquireReply(LockState.HELD, lease_left=-0.002)
        reply = self.cache.take_lock(keys, token, lease_ms)
        if reply.state is LockState.HELD:
            forgotten = self.cache.holder(keys)  # its session ended: see the module
            if forgotten is not None and forgotten != token:
                self.cache.release(keys, forgotten)
            reply = self.cache.take_lock(keys, token, lease_ms)
        if reply.state is not LockState.LOCKED:
            return reply
        return AcquireReply(LockState.LOCKED, fence=fence)

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return self.queue.holds(keys, token) and self.cache.renew(keys, token, lease_ms)

    def release(self, keys: EntryKeys, token: str) -> bool:
        try:
            return self.cache.release(keys, token)
        finally:
            self.queue.leave(keys, token)

    def leave_queue(self, keys: EntryKeys, token: str) -> None:
        self.queue.leave(keys, token)

    def holder(self, keys: EntryKeys) -> str | None:
        return self.cache.holder(keys)

    def subscribe(self, keys: EntryKeys) -> Subscription:
        return _Watched(self.cache.subscribe(keys), self.wakers, keys.channel)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)  # every other step is the cache server's


class AsyncZooKeeperLockStore:
    """``ZooKeeperLockStore`` for the tasks of one event loop."""

    def __init__(self, cache: AsyncStore, queue: ZooKeeperQueue, wakers: Wakers) -> None:
        self.cache = cache
        self.queue = queue
        self.wakers = wakers

    async def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        fence, before = await asyncio.to_thread(self.queue.enqueue, keys, token)
        if before is not None:
            await asyncio.to_thread(self.queue.watch, before, self.wakers.waker(keys.channel))
            if not queue_ms:
                await asyncio.to_thread(self.queue.leave, keys, token)
            return AcquireReply(LockState.HELD, lease_left=-0.002)
        reply = await self.cache.take_lock(keys, token, lease_ms)
        if reply.state is LockState.HELD:
            forgotten = await self.cache.holder(keys)
            if forgotten is not None and forgotten != token:
                await self.cache.release(keys, forgotten)
            reply = await self.cache.take_lock(keys, token, lease_ms)
        if reply.state is not LockState.LOCKED:
            return reply
        return AcquireReply(LockState.LOCKED, fence=fence)

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return await asyncio.to_thread(self.queue.holds, keys, token) and await self.cache.renew(keys, token, lease_ms)

    async def release(self, keys: EntryKeys, token: str) -> bool:
        try:
            return await self.cache.release(keys, token)
        finally:
            await asyncio.to_thread(self.queue.leave, keys, token)

    async def leave_queue(self, keys: EntryKeys, token: str) -> None:
        await asyncio.to_thread(self.queue.leave, keys, token)

    async def holder(self, keys: EntryKeys) -> str | None:
        return await self.cache.holder(keys)

    async def subscribe(self, keys: EntryKeys) -> AsyncSubscription:
        return _AsyncWatched(await self.cache.subscribe(keys), self.wakers, keys.channel)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)
