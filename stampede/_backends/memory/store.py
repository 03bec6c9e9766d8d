"""The embedded backend: the store in this process's memory, for zero-setup use.

Values live in a cachetools TLRUCache whose per-item expiry is the envelope's TTL, so
the value and the null sentinel keep their own lifetimes and the cache stays bounded.
Leases and wake-ups behave as in Redis, so the one flow serves both backends: an
invalidation still wins over a load in flight.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from cachetools import TLRUCache

from ..._core.codec import stale_window_of
from ..._core.keys import EntryKeys, entry_value_keys, failing_key
from ..._core.store import (
    FAILED_HOLD,
    GRANTED,
    LEASE_GONE,
    TRACE_MARK,
    AcquireReply,
    AsyncSubscription,
    LockState,
    Roles,
    Subscription,
    Written,
)
from ..._core.tags import Tagged, TagKeys
from ..._core.versions import saw_versions
from ..._fork import reset_after_fork
from ..aeach import AsyncOneByOne
from ..channels import Mailbox, Waiting
from ..each import OneByOne
from ..mailbox import LoopMailbox, ThreadMailbox
from .relays import Relays
from .tags import Tags


class MemoryStore(OneByOne):
    """A Store in memory. Thread-safe. Shared by every loader of one layer."""

    optional_roles = Roles.BUDGETS | Roles.HOT_SETS | Roles.SLOT_LEASES | Roles.STREAMS

    def __init__(
        self,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``clock``: the store's monotonic clock (expiries, leases); ``wall``: its wall
        clock, which fences and tag clocks never fall behind (as Redis's ``TIME``), so
        that they keep growing across a restart. The simulator gives its virtual ones."""
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        # item = (envelope, expires_at). TLRUCache drops it at expires_at
        self._values: TLRUCache[str, tuple[bytes, float]] = TLRUCache(
            maxsize=max_entries, ttu=lambda _key, item, _now: item[1], timer=clock
        )
        self._leases: dict[str, tuple[str, float]] = {}  # lock key -> (token, expires_at)
        # failing marker -> expires_at (see Store.hold). Bounded like the values
        self._failing: TLRUCache[str, float] = TLRUCache(
            maxsize=max_entries, ttu=lambda _key, expires_at, _now: expires_at, timer=clock
        )
        self._last_fence = 0  # the last fencing token drawn, for every named lock (one int, however many names)
        self._queues: dict[str, dict[str, float]] = {}  # a fair lock's key -> {token: waiter expiry}, in order
        self._slots: dict[str, dict[str, float]] = {}  # a load budget's key -> {holder token: lease end}
        # a load budget's key -> {waiter token: (the entry it would load, its token on its lease)}
        self._slot_leases: dict[str, dict[str, tuple[EntryKeys, str]]] = {}
        self._hot: dict[str, tuple[dict[bytes, float], float]] = {}  # a hot set's key -> (counts, expires_at)
        self._waiting = Waiting()
        self._tags = Tags(self._wall_us)
        # value key -> (its tags, expires_at), bounded like the values
        self._entry_tags: TLRUCache[str, tuple[list[str], float]] = TLRUCache(
            maxsize=max_entries, ttu=lambda _key, item, _now: item[1], timer=clock
        )
        self.relays = Relays(clock)
        reset_after_fork(self)

    def _wall_us(self) -> int:
        """The store's wall clock in microseconds (as Redis's ``TIME``)."""
        return int(self._wall() * 1_000_000)

    def after_fork_in_child(self) -> None:
        """The child keeps the values. The parent's loads and waiters are not here."""
        self._lock = threading.Lock()
        self._leases, self._waiting = {}, Waiting()
        self.relays = Relays(self._clock)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            item = self._values.get(key)
        return None if item is None else item[0]

    def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]:
        now = self._clock()
        with self._lock:
            item = self._values.get(key)
            marked = failing and failing_key(key) in self._failing
        return (None, 0.0, False) if item is None else (item[0], item[1] - now, marked)

    def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"", clock: str = ""
    ) -> AcquireReply:
        # ``clock`` is left to the flow: reading it is no round trip here.
        now = self._clock()
        with self._lock:
            item = self._values.get(keys.value) if check_value else None
            if item is not None and not (stale and item[0].startswith(stale)):
                return AcquireReply(LockState.VALUE, item[0], ttl_left=item[1] - now)
            holder = self._live_lease(keys, now)
            if holder is not None:
                traced = holder[0] if TRACE_MARK in holder[0] else ""  # a token that carries a trace
                return AcquireReply(
                    LockState.HELD, lease_left=holder[1] - now, failed=holder[0] == FAILED_HOLD, holder=traced
                )
            self._leases[keys.lock] = (token, now + lease_ms / 1000)
            return AcquireReply(LockState.LOCKED)

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        now = self._clock()
        with self._lock:
            if not self._holds(keys, token, now):
                return False
            self._leases[keys.lock] = (token, now + lease_ms / 1000)
            return True

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        with self._lock:
            return self._write_release(keys, token, envelope, ttl_ms, inline, tagged)

    def _write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None
    ) -> Written:
        """``write_release``, the store's lock held."""
        now = self._clock()
        if not self._holds(keys, token, now):
            return Written.REFUSED  # nothing here evicts a lease
        if tagged is not None:
            if not self._tags.admit(tagged, keys.value, now, now + ttl_ms / 1000):
                del self._leases[keys.lock]
                self._publish(keys, b"")
                return Written.REFUSED
            if ttl_ms:
                self._entry_tags[keys.value] = (tagged.tags.names.split(" "), now + ttl_ms / 1000)
        if ttl_ms:
            self._values[keys.value] = (envelope, now + ttl_ms / 1000)
        else:  # kept by nobody (a store=False value): only its waiters get it
            self._values.pop(keys.value, None)
            self._entry_tags.pop(keys.value, None)
        del self._leases[keys.lock]
        self._failing.pop(keys.failing, None)
        self._publish(keys, envelope if inline else b"")
        return Written.YES

    def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written:
        now = self._clock()
        with self._lock:
            if not self._holds(keys, token, now):
                return Written.REFUSED
            del self._leases[keys.lock]
            self._publish(keys, b"")
            item = self._values.get(keys.value)
            if item is None or not item[0].startswith(identity):
                return Written.REFUSED
            self._values[keys.value] = (item[0], now + ttl_ms / 1000)
            self._failing.pop(keys.failing, None)
            return Written.YES

    def release(self, keys: EntryKeys, token: str) -> bool:
        with self._lock:
            if not self._holds(keys, token, self._clock()):
                return False
            del self._leases[keys.lock]
            self._publish(keys, b"")
            return True

    def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        now = self._clock()
        with self._lock:
            if not self._holds(keys, token, now):
                return False
            self._leases[keys.lock] = (FAILED_HOLD, now + hold_ms / 1000)
            self._failing[keys.failing] = now + failing_ms / 1000
            self._publish(keys, b"")
            return True

    def expire(self, keys: EntryKeys) -> None:
        now = self._clock()
        with self._lock:
            self._report_versions(keys, now)
            item = self._values.get(keys.value)
            if item is not None:
                keep = stale_window_of(item[0])
                if keep < 0.001:
                    del self._values[keys.value]
                elif item[1] - now > keep:
                    self._values[keys.value] = (item[0], now + keep)
            self._leases.pop(keys.lock, None)
            self._failing.pop(keys.failing, None)
            self._publish(keys, b"")

    def leave_queue(self, keys: EntryKeys, token: str) -> None:
        with self._lock:
            queue = self._queues.get(keys.lock)
            if queue is not None and queue.pop(token, None) is not None:
                self._publish(keys, b"")

    def holder(self, keys: EntryKeys) -> str | None:
        with self._lock:
            lease = self._live_lease(keys, self._clock())
        return None if lease is None else lease[0]

    def relay_add(self, keys: EntryKeys, token: str, records: Sequence[bytes], first: int, linger_ms: int) -> None:
        self.relays.add(keys.relay(token), records, first, linger_ms)

    def relay_read(self, keys: EntryKeys, token: str, after: int, block_ms: int) -> list[bytes]:
        return self.relays.wait(keys.relay(token), after, block_ms / 1000)

    def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        now = self._clock()
        with self._lock:
            queue = self._queues.setdefault(keys.lock, {}) if queue_ms else None
            if queue is not None:  # the rules of TAKE_LOCK_FAIRLY
                for waiter, expiry in list(queue.items()):
                    if waiter == token or expiry > now:
                        break
                    del queue[waiter]
                queue[token] = now + queue_ms / 1000
            holder = self._live_lease(keys, now)
            if holder is not None:
                return AcquireReply(LockState.HELD, lease_left=holder[1] - now)
            if queue is not None:
                if next(iter(queue)) != token:
                    return AcquireReply(LockState.HELD, lease_left=-0.002)
                del queue[token]
            self._leases[keys.lock] = (token, now + lease_ms / 1000)
            fence = self._last_fence = max(self._last_fence + 1, self._wall_us())
            return AcquireReply(LockState.LOCKED, fence=fence)

    def note_hot(self, key: str, counts: Mapping[bytes, int], limit: int, ttl_ms: int) -> None:
        now = self._clock()
        with self._lock:  # the rules of NOTE_HOT
            for gone in [name for name, (_, end) in self._hot.items() if end <= now]:
                del self._hot[gone]
            scores = self._hot[key][0] if key in self._hot else {}
            for member, count in counts.items():
                scores[member] = scores.get(member, 0.0) + count
            if len(scores) > limit:
                kept = sorted(scores, key=lambda member: (scores[member], member))[len(scores) - limit :]
                scores = {member: scores[member] for member in kept}
            self._hot[key] = (scores, now + ttl_ms / 1000)

    def hot_members(self, key: str, count: int) -> list[tuple[bytes, float]]:
        now = self._clock()
        with self._lock:
            scores, end = self._hot.get(key, ({}, now))
            if end <= now:
                return []
            ranked = sorted(scores.items(), key=lambda item: (item[1], item[0]), reverse=True)
        return ranked[:count]

    def take_slot(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int) -> AcquireReply:
        now = self._clock()
        with self._lock:
            return self._take_slot(keys, token, lease_ms, queue_ms, slots, now)

    def take_slot_for(
        self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int, entry: EntryKeys, lease: str
    ) -> AcquireReply:
        now = self._clock()
        with self._lock:
            leases = self._slot_leases.setdefault(keys.lock, {})
            if not self._holds(entry, lease, now):
                self._queues.get(keys.lock, {}).pop(token, None)
                leases.pop(token, None)
                return AcquireReply(LockState.LEASE_GONE)
            leases[token] = (entry, lease)
            reply = self._take_slot(keys, token, lease_ms, queue_ms, slots, now)
            if reply.state is LockState.LOCKED:
                leases.pop(token, None)
            return reply

    def _take_slot(
        self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int, now: float
    ) -> AcquireReply:
        """The rules of TAKE_SLOT, under the lock."""
        holders = self._slots.setdefault(keys.lock, {})
        for holder, end in list(holders.items()):
            if end <= now:
                del holders[holder]
        if token in holders:
            holders[token] = now + lease_ms / 1000
            return AcquireReply(LockState.LOCKED)
        queue = self._queues.setdefault(keys.lock, {})
        queue[token] = now + queue_ms / 1000  # a new waiter goes last; a known one keeps its place
        free = slots - len(holders)
        ahead = 0
        for waiter, expiry in list(queue.items()):
            if ahead >= free:
                break
            if waiter == token:
                del queue[token]
                holders[token] = now + lease_ms / 1000
                return AcquireReply(LockState.LOCKED)
            if expiry > now:
                ahead += 1
            else:
                del queue[waiter]
                self._slot_leases.get(keys.lock, {}).pop(waiter, None)
        if free > 0:
            return AcquireReply(LockState.HELD, lease_left=-0.002)
        return AcquireReply(LockState.HELD, lease_left=max(min(holders.values()) - now, 0.0))

    def renew_slot(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        now = self._clock()
        with self._lock:
            holders = self._slots.get(keys.lock, {})
            if holders.get(token, now) <= now:
                return False
            holders[token] = now + lease_ms / 1000
            return True

    def release_slot(self, keys: EntryKeys, token: str, slots: int, lease_ms: int) -> bool:
        now = self._clock()
        with self._lock:  # the rules of RELEASE_SLOT
            holders = self._slots.setdefault(keys.lock, {})
            released = holders.pop(token, None) is not None
            for holder, end in list(holders.items()):
                if end <= now:
                    del holders[holder]
            queue = self._queues.get(keys.lock, {})
            queue.pop(token, None)
            leases = self._slot_leases.get(keys.lock, {})
            leases.pop(token, None)
            free = slots - len(holders)
            for waiter, expiry in list(queue.items()):
                if free <= 0:
                    break
                del queue[waiter]
                entry = leases.pop(waiter, None)
                if expiry <= now:
                    continue
                if entry is not None and not self._holds(entry[0], entry[1], now):
                    message = LEASE_GONE  # its load could not be written: the slot goes on down the line
                else:
                    holders[waiter] = now + lease_ms / 1000
                    free -= 1
                    message = GRANTED
                for mailbox in self._waiting.on(keys.waiter(waiter).channel):
                    mailbox.deliver(message)
            return released

    def invalidate(self, keys: EntryKeys) -> None:
        with self._lock:
            self._report_versions(keys, self._clock())
            self._values.pop(keys.value, None)
            self._leases.pop(keys.lock, None)
            self._failing.pop(keys.failing, None)
            self._publish(keys, b"")

    def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        with self._lock:
            self._seize(keys, token, lease_ms)

    def _seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        self._report_versions(keys, self._clock())
        self._values.pop(keys.value, None)
        self._failing.pop(keys.failing, None)
        self._leases[keys.lock] = (token, self._clock() + lease_ms / 1000)
        self._publish(keys, b"")

    def put(
        self, keys: EntryKeys, token: str, lease_ms: int, envelope: bytes, ttl_ms: int, inline: bool,
        tagged: Tagged | None = None,
    ) -> Written:  # fmt: skip
        """The seizure and the write under one hold of the store's lock: nothing between."""
        with self._lock:
            self._seize(keys, token, lease_ms)
            return self._write_release(keys, token, envelope, ttl_ms, inline, tagged)

    def mark_versioned(self, keys: Sequence[EntryKeys], marker_ms: int) -> None:
        now = self._clock()
        with self._lock:
            for entry in keys:
                item = self._values.get(entry.versioned)
                if item is None or item[1] < now + marker_ms / 1000:
                    self._values[entry.versioned] = (b"1", now + marker_ms / 1000)

    def _report_versions(self, keys: EntryKeys, now: float) -> None:
        """Report a versioned loader's mark on the entry (``_core.versions``)."""
        item = self._values.get(keys.versioned)
        if item is not None and item[1] > now:
            saw_versions(keys.value)

    def tag_clock(self, key: str) -> int:
        with self._lock:
            return self._tags.clock(key)

    def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]:
        return self.invalidate_tagged(clock, tag, soft)[1]

    def invalidate_tagged(self, clock: str, tag: TagKeys, soft: bool) -> tuple[list[str], list[str]]:
        """``invalidate_tag``: every live member of the tag, and those it dropped (a value
        or a lease). The tag's mark is one step under the store's lock: nothing can come
        between (see ``_core.tags``). Both lists are what a near cache's agreement needs
        (``_core.near.asked_of_a_tag``): the simulated store's (``stampede.testing``)."""
        now = self._clock()
        with self._lock:
            members = self._tags.mark(clock, tag, now, forget=not soft)
            held = [key for key in members if key in self._values or EntryKeys.for_value(key).lock in self._leases]
        for value_key in members:
            (self.expire if soft else self.invalidate)(EntryKeys.for_value(value_key))
        return members, held

    def entry_tags(self, keys: EntryKeys) -> list[str] | None:
        with self._lock:
            if keys.value not in self._values:
                return None
            item = self._entry_tags.get(keys.value)
        return None if item is None else item[0]

    def check(self, namespace: str) -> None:
        """Nothing to check: the store is this process's memory."""

    def scan(self, namespace: str, match: str = "*") -> set[str]:
        """The value keys of every cache entry in ``namespace``: values and leases of
        loads, not named locks (their fences must never go back). ``match`` narrows
        nothing here: callers test each entry."""
        prefix = namespace + ":{"
        with self._lock:
            keys = [key for key in (*self._values.keys(), *self._leases) if key.startswith(prefix)]
        return entry_value_keys(keys)

    def subscribe(self, keys: EntryKeys) -> Subscription:
        subscription = ThreadMailbox(keys.channel, self.detach)
        self.attach(subscription)
        return subscription

    def attach(self, mailbox: Mailbox) -> None:
        """Deliver the entry's wake-ups to ``mailbox`` (of a blocking or an asyncio waiter)."""
        with self._lock:
            self._waiting.add(mailbox)
        mailbox.confirm(True)

    def detach(self, mailbox: Mailbox) -> None:
        with self._lock:
            self._waiting.remove(mailbox)

    def close(self) -> None:
        with self._lock:
            self._values.clear()
            self._leases.clear()
            self._failing.clear()

    def _live_lease(self, keys: EntryKeys, now: float) -> tuple[str, float] | None:
        lease = self._leases.get(keys.lock)
        if lease is not None and lease[1] <= now:
            del self._leases[keys.lock]
            return None
        return lease

    def _holds(self, keys: EntryKeys, token: str, now: float) -> bool:
        lease = self._live_lease(keys, now)
        return lease is not None and lease[0] == token

    def _publish(self, keys: EntryKeys, message: bytes) -> None:
        for mailbox in self._waiting.on(keys.channel):
            mailbox.deliver(message)


class AsyncMemoryStore(AsyncOneByOne):
    """The embedded store for asyncio callers: the same ``MemoryStore`` (so blocking and
    asyncio callers of one layer share entries, leases and wake-ups), its brief
    in-memory steps called directly from the loop."""

    optional_roles = MemoryStore.optional_roles

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def get(self, key: str) -> bytes | None:
        return self._store.get(key)

    async def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]:
        return self._store.get_with_ttl(key, failing)

    async def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"", clock: str = ""
    ) -> AcquireReply:
        return self._store.acquire(keys, token, lease_ms, check_value, stale, clock)

    async def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        return self._store.hold(keys, token, hold_ms, failing_ms)

    async def expire(self, keys: EntryKeys) -> None:
        self._store.expire(keys)

    async def mark_versioned(self, keys: Sequence[EntryKeys], marker_ms: int) -> None:
        self._store.mark_versioned(keys, marker_ms)

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return self._store.renew(keys, token, lease_ms)

    async def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        return self._store.write_release(keys, token, envelope, ttl_ms, inline, tagged)

    async def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written:
        return self._store.touch(keys, token, identity, ttl_ms)

    async def tag_clock(self, key: str) -> int:
        return self._store.tag_clock(key)

    async def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]:
        return self._store.invalidate_tag(clock, tag, soft)

    async def entry_tags(self, keys: EntryKeys) -> list[str] | None:
        return self._store.entry_tags(keys)

    async def release(self, keys: EntryKeys, token: str) -> bool:
        return self._store.release(keys, token)

    async def relay_add(
        self, keys: EntryKeys, token: str, records: Sequence[bytes], first: int, linger_ms: int
    ) -> None:
        self._store.relay_add(keys, token, records, first, linger_ms)

    async def relay_read(self, keys: EntryKeys, token: str, after: int, block_ms: int) -> list[bytes]:
        return await self._store.relays.await_records(keys.relay(token), after, block_ms / 1000)

    async def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        return self._store.take_lock(keys, token, lease_ms, queue_ms)

    async def holder(self, keys: EntryKeys) -> str | None:
        return self._store.holder(keys)

    async def leave_queue(self, keys: EntryKeys, token: str) -> None:
        self._store.leave_queue(keys, token)

    async def take_slot(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int) -> AcquireReply:
        return self._store.take_slot(keys, token, lease_ms, queue_ms, slots)

    async def take_slot_for(
        self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int, entry: EntryKeys, lease: str
    ) -> AcquireReply:
        return self._store.take_slot_for(keys, token, lease_ms, queue_ms, slots, entry, lease)

    async def note_hot(self, key: str, counts: Mapping[bytes, int], limit: int, ttl_ms: int) -> None:
        self._store.note_hot(key, counts, limit, ttl_ms)

    async def hot_members(self, key: str, count: int) -> list[tuple[bytes, float]]:
        return self._store.hot_members(key, count)

    async def renew_slot(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return self._store.renew_slot(keys, token, lease_ms)

    async def release_slot(self, keys: EntryKeys, token: str, slots: int, lease_ms: int) -> bool:
        return self._store.release_slot(keys, token, slots, lease_ms)

    async def invalidate(self, keys: EntryKeys) -> None:
        self._store.invalidate(keys)

    async def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        self._store.seize(keys, token, lease_ms)

    async def put(
        self, keys: EntryKeys, token: str, lease_ms: int, envelope: bytes, ttl_ms: int, inline: bool,
        tagged: Tagged | None = None,
    ) -> Written:  # fmt: skip
        return self._store.put(keys, token, lease_ms, envelope, ttl_ms, inline, tagged)

    async def check(self, namespace: str) -> None:
        pass

    async def scan(self, namespace: str, match: str = "*") -> set[str]:
        return self._store.scan(namespace, match)

    async def subscribe(self, keys: EntryKeys) -> AsyncSubscription:
        subscription = LoopMailbox(keys.channel, asyncio.get_running_loop(), self._store.detach)
        self._store.attach(subscription)
        return subscription

    async def aclose(self) -> None:
        pass  # the blocking side owns the store
