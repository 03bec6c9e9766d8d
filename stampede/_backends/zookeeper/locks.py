# Generated from alocks.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
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

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._core.keys import EntryKeys
from ..._core.store import AcquireReply, LockState, Store, Subscription
from .lines import Wakers, ZooKeeperQueue


class _Watched:
    """A subscription that also hears ZooKeeper watches until closed."""

    def __init__(self, subscription: Subscription, wakers: Wakers, channel: str) -> None:
        self._subscription = subscription
        self._deliver: Callable[[bytes], None] = getattr(subscription, "deliver")  # noqa: B009
        self._wakers, self._channel = wakers, channel
        wakers.add(channel, self._deliver)

    def wait(self, timeout: float) -> bytes | None:
        return self._subscription.wait(timeout)

    def close(self) -> None:
        self._wakers.remove(self._channel, self._deliver)
        self._subscription.close()


class ZooKeeperLockStore:
    """The store of a ZooKeeper layer's named locks (only the named locks' methods
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
