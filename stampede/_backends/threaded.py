"""An asyncio store over a blocking one, through threads (``stampede.backends.
ThreadedAsyncStore``): an outside backend writes its ``Store`` once, and its layer
serves ``async def`` loaders too, as Django's ``BaseCache`` gives every ``a``-method.

Each command runs the blocking store's in a worker thread of the adapter's own (never
the event loop's default executor, which the application's ``to_thread`` calls share),
so the loop never blocks on the store. A wait on an entry's channel holds a thread of a
pool of its own for up to its timeout (a re-check interval, a lease at most), so that
commands never queue behind waits: with more waits at once than ``waits`` threads, a
wait begins late (one per key in flight per event loop waits: the others wait in memory).

A command whose caller is cancelled runs on to its end in its thread (a thread cannot be
stopped): the caller's cancellation waits for it, so that what the caller does next (the
flow releases its lease by token) comes after the command, as it would on a blocking
caller. Context variables travel into the thread and what a store tells them comes back
(``_core.versions``), as ``asyncio.to_thread`` does.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

from .._core.keys import EntryKeys
from .._core.store import (
    AcquireCall,
    AcquireReply,
    Roles,
    Store,
    StreamStore,
    Subscription,
    WriteCall,
    Written,
    roles_of,
)
from .._core.tags import Tagged, TagKeys
from .._errors import BackendUnavailable

T = TypeVar("T")

COMMAND_THREADS = 32  # commands under way at once, per event loop
WAIT_THREADS = 256  # waits on channels at once, per event loop


class ThreadedAsyncStore:
    """``AsyncStore`` over ``store``, a blocking ``Store``, for the tasks of one event loop
    (``Backend.make_async_store``: one per loop). It declares the optional roles ``store``
    declares. Closing it stops its threads; the blocking store is its own owner's to close."""

    def __init__(self, store: Store, *, threads: int = COMMAND_THREADS, waits: int = WAIT_THREADS) -> None:
        self._store = store
        self.optional_roles: Roles = roles_of(store)
        self._commands = ThreadPoolExecutor(threads, thread_name_prefix="stampede-store")
        self._waits = ThreadPoolExecutor(waits, thread_name_prefix="stampede-wait")

    async def _run(self, command: Callable[..., T], *args: Any, executor: ThreadPoolExecutor | None = None) -> T:
        """``command(*args)`` in a thread; a cancellation waits for it to end."""
        call = functools.partial(contextvars.copy_context().run, command, *args)
        future = asyncio.get_running_loop().run_in_executor(executor or self._commands, call)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            while not future.done():  # the command runs on: what the caller does next comes after it
                try:
                    await asyncio.wait([future])
                except asyncio.CancelledError:
                    continue
            raise

    async def subscribe(self, keys: EntryKeys) -> ThreadedSubscription:
        return ThreadedSubscription(await self._run(self._store.subscribe, keys), self)

    async def subscribe_many(self, keys: Sequence[EntryKeys]) -> Sequence[ThreadedSubscription | BackendUnavailable]:
        subscribed = await self._run(self._store.subscribe_many, keys)
        return [
            each if isinstance(each, BackendUnavailable) else ThreadedSubscription(each, self) for each in subscribed
        ]

    async def aclose(self) -> None:
        self._commands.shutdown(wait=False)
        self._waits.shutdown(wait=False)

    async def get(self, key: str) -> bytes | None:
        return await self._run(self._store.get, key)

    async def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]:
        return await self._run(self._store.get_with_ttl, key, failing)

    async def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"", clock: str = ""
    ) -> AcquireReply:
        return await self._run(self._store.acquire, keys, token, lease_ms, check_value, stale, clock)

    async def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        return await self._run(self._store.hold, keys, token, hold_ms, failing_ms)

    async def expire(self, keys: EntryKeys) -> None:
        return await self._run(self._store.expire, keys)

    async def mark_versioned(self, keys: Sequence[EntryKeys], marker_ms: int) -> None:
        return await self._run(self._store.mark_versioned, keys, marker_ms)

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return await self._run(self._store.renew, keys, token, lease_ms)

    async def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        return await self._run(self._store.write_release, keys, token, envelope, ttl_ms, inline, tagged)

    async def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written:
        return await self._run(self._store.touch, keys, token, identity, ttl_ms)

    async def release(self, keys: EntryKeys, token: str) -> bool:
        return await self._run(self._store.release, keys, token)

    async def holder(self, keys: EntryKeys) -> str | None:
        return await self._run(self._store.holder, keys)

    async def relay_add(
        self, keys: EntryKeys, token: str, records: Sequence[bytes], first: int, linger_ms: int
    ) -> None:
        store = cast(StreamStore, self._store)
        return await self._run(store.relay_add, keys, token, records, first, linger_ms)

    async def relay_read(self, keys: EntryKeys, token: str, after: int, block_ms: int) -> list[bytes]:
        store = cast(StreamStore, self._store)  # a read that waits, among the waits
        return await self._run(store.relay_read, keys, token, after, block_ms, executor=self._waits)

    async def invalidate(self, keys: EntryKeys) -> None:
        return await self._run(self._store.invalidate, keys)

    async def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        return await self._run(self._store.seize, keys, token, lease_ms)

    async def put(
        self,
        keys: EntryKeys,
        token: str,
        lease_ms: int,
        envelope: bytes,
        ttl_ms: int,
        inline: bool,
        tagged: Tagged | None = None,
    ) -> Written:
        return await self._run(self._store.put, keys, token, lease_ms, envelope, ttl_ms, inline, tagged)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return await self._run(self._store.get_many, keys)

    async def get_many_with_ttl(
        self, keys: Sequence[str], failing: bool = False
    ) -> list[tuple[bytes | None, float, bool]]:
        return await self._run(self._store.get_many_with_ttl, keys, failing)

    async def acquire_many(self, calls: Sequence[AcquireCall]) -> list[AcquireReply | BackendUnavailable]:
        return await self._run(self._store.acquire_many, calls)

    async def write_release_many(self, calls: Sequence[WriteCall]) -> list[Written | BackendUnavailable]:
        return await self._run(self._store.write_release_many, calls)

    async def tag_clock(self, key: str) -> int:
        return await self._run(self._store.tag_clock, key)

    async def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]:
        return await self._run(self._store.invalidate_tag, clock, tag, soft)

    async def entry_tags(self, keys: EntryKeys) -> list[str] | None:
        return await self._run(self._store.entry_tags, keys)

    async def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        return await self._run(self._store.take_lock, keys, token, lease_ms, queue_ms)

    async def leave_queue(self, keys: EntryKeys, token: str) -> None:
        return await self._run(self._store.leave_queue, keys, token)

    async def take_slot(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int) -> AcquireReply:
        return await self._run(self._store.take_slot, keys, token, lease_ms, queue_ms, slots)

    async def renew_slot(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return await self._run(self._store.renew_slot, keys, token, lease_ms)

    async def release_slot(self, keys: EntryKeys, token: str, slots: int, lease_ms: int) -> bool:
        return await self._run(self._store.release_slot, keys, token, slots, lease_ms)

    async def take_slot_for(
        self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int, entry: EntryKeys, lease: str
    ) -> AcquireReply:
        return await self._run(
            self._store.take_slot_for,  # type: ignore[attr-defined]  # SlotLeaseStore's, where declared
            keys,
            token,
            lease_ms,
            queue_ms,
            slots,
            entry,
            lease,
        )

    async def note_hot(self, key: str, counts: Mapping[bytes, int], limit: int, ttl_ms: int) -> None:
        return await self._run(self._store.note_hot, key, counts, limit, ttl_ms)

    async def hot_members(self, key: str, count: int) -> list[tuple[bytes, float]]:
        return await self._run(self._store.hot_members, key, count)

    async def check(self, namespace: str) -> None:
        return await self._run(self._store.check, namespace)

    async def scan(self, namespace: str, match: str = "*") -> set[str]:
        return await self._run(self._store.scan, namespace, match)


class ThreadedSubscription:
    """``AsyncSubscription`` over a blocking one: a wait holds a thread of the waits' pool."""

    def __init__(self, subscription: Subscription, store: ThreadedAsyncStore) -> None:
        self._subscription = subscription
        self._store = store

    async def wait(self, timeout: float) -> bytes | None:
        return await self._store._run(self._subscription.wait, timeout, executor=self._store._waits)

    def close(self) -> None:
        self._subscription.close()
