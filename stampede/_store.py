"""What the flow needs from a store: the interface every backend implements, blocking
(``Store``) and asyncio (``AsyncStore``: the same methods, awaited).

A backend stores envelopes, holds leases (a lock key with a token and an expiry) and
wakes waiters. Methods raise ``BackendUnavailable`` when the store fails, never a
client library's own exception. Durations are in milliseconds, as Redis takes them.
"""

from __future__ import annotations

from typing import Protocol

from ._anotify import AsyncSubscription
from ._flow import AcquireReply, Written
from ._keys import EntryKeys
from ._notify import Subscription


class Renewable(Protocol):
    """What the lease watchdog needs: a store, or a lock over several servers."""

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        """Extend the lease if ``token`` still holds it."""


class AsyncRenewable(Protocol):
    """``Renewable`` for an asyncio renewal task."""

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool: ...


class Store(Protocol):
    def get(self, key: str) -> bytes | None:
        """The raw bytes at ``key``, or None."""

    def acquire(self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool) -> AcquireReply:
        """Return the value if there is one (and ``check_value``), else take the lock or
        report how long another holder's lease has left."""

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        """Extend the lease if ``token`` still holds it."""

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool
    ) -> Written:
        """If ``token`` still holds the lease: write, release, wake waiters (with the
        envelope if ``inline``) and return ``Written.YES``; else write nothing and say why
        (``REFUSED``: invalidated or taken over; ``VANISHED``: gone, not invalidated)."""

    def release(self, keys: EntryKeys, token: str) -> bool:
        """Release the lease if ``token`` holds it, wake waiters to re-check, and return
        True; return False if the lease was not ``token``'s."""

    def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        """Take a named lock (LOCKED, with the next fencing token from ``keys.value``) or
        report how long the holder's lease has left (HELD). With ``queue_ms``, in arrival
        order: join the queue (or renew the place in it for ``queue_ms``) and take the
        lock only when first in line."""

    def leave_queue(self, keys: EntryKeys, token: str) -> None:
        """Give up a place in a fair lock's queue, waking the other waiters."""

    def holder(self, keys: EntryKeys) -> str | None:
        """The token holding the lease, or None."""

    def invalidate(self, keys: EntryKeys) -> None:
        """Delete the value and any lease, and wake waiters to re-check; a holder's write
        after it is ``REFUSED``."""

    def subscribe(self, keys: EntryKeys) -> Subscription:
        """A confirmed mailbox on the entry's channel."""

    def check(self, namespace: str) -> None:
        """Raise ``BackendUnavailable`` naming the cause unless the store answers and takes
        writes in ``namespace``."""

    def scan(self, namespace: str) -> set[str]:
        """The value keys of every cache entry in ``namespace``, named locks left out."""

    def close(self) -> None:
        """Release connections and threads the store started."""


class AsyncStore(Protocol):
    """``Store`` for the tasks of one event loop; see ``Store`` for each method."""

    async def get(self, key: str) -> bytes | None: ...

    async def acquire(self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool) -> AcquireReply: ...

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool: ...

    async def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool
    ) -> Written: ...

    async def release(self, keys: EntryKeys, token: str) -> bool: ...

    async def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply: ...

    async def leave_queue(self, keys: EntryKeys, token: str) -> None: ...

    async def holder(self, keys: EntryKeys) -> str | None: ...

    async def invalidate(self, keys: EntryKeys) -> None: ...

    async def subscribe(self, keys: EntryKeys) -> AsyncSubscription: ...

    async def check(self, namespace: str) -> None: ...

    async def scan(self, namespace: str) -> set[str]: ...

    async def aclose(self) -> None: ...
