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

kazoo's calls block: a task runs each ZooKeeper step in a worker thread.
"""

# locks.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..._core.keys import EntryKeys
from ..._core.store import AcquireReply, AsyncStore, AsyncSubscription, LockState
from .lines import Wakers, ZooKeeperQueue


class _AsyncWatched:
    """A subscription that also hears ZooKeeper watches until closed."""

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


class AsyncZooKeeperLockStore:
    """The store of a ZooKeeper layer's named locks (only the named locks' methods
    differ from the cache server's, see the module)."""

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
            forgotten = await self.cache.holder(keys)  # its session ended: see the module
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
        return getattr(self.cache, name)  # every other step is the cache server's
