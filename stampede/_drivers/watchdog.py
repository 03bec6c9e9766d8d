"""The lease watchdog: one thread per layer renews the lease of every load in progress
(and of every named lock held by a thread). A task renews an asyncio holder's lease.

A loader slower than ``lock_ttl`` must not lose its lock to a waiter (that would load a
second time), and a holder that dies must lose it within ``lock_ttl``. So a lease is
short and renewed every lock_ttl/3 while its loader runs. A renewal that finds the lock
gone or someone else's marks the lease lost. The write then fails by itself, because
the write script checks the token too.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from .._core.effects import Lease
from .._core.keys import EntryKeys
from .._core.store import AsyncRenewable, Renewable
from .._errors import BackendUnavailable
from .._fork import reset_after_fork
from .observe import RateLimitedLog

log = logging.getLogger("stampede.lock")
_warn = RateLimitedLog(log)  # an outage fails every renewal at once: one warning per kind per 10 s


@dataclass(eq=False)
class WatchedLease:
    store: Renewable
    keys: EntryKeys
    token: str
    lease_ms: int
    due: float  # monotonic time of the next renewal
    lost: bool = False
    active: bool = True  # false once its load is over: dropped when it comes due

    def stop(self) -> None:
        """No more renewals: the load is over."""
        self.active = False


class Watchdog:
    """Renews registered leases every lease/3 from one daemon thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, WatchedLease]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        reset_after_fork(self)

    @contextmanager
    def guard(self, store: Renewable, keys: EntryKeys, token: str, lease_ms: int) -> Iterator[WatchedLease]:
        """Keep the lease renewed for the duration of the ``with`` block."""
        with self.guard_many(store, [Lease(keys, token, lease_ms)]) as (lease,):
            yield lease

    def watch(self, store: Renewable, keys: EntryKeys, token: str, lease_ms: int) -> WatchedLease:
        """Keep the lease renewed until its ``active`` is set False."""
        return self._watch(store, [Lease(keys, token, lease_ms)])[0]

    @contextmanager
    def guard_many(self, store: Renewable, leases: Sequence[Lease]) -> Iterator[list[WatchedLease]]:
        """``guard`` of each of ``leases`` (a batch's loads), registered in one step: a
        page of cold entries takes the lock and checks the thread once, not once each."""
        watched = self._watch(store, leases)
        try:
            yield watched
        finally:
            for lease in watched:
                lease.active = False  # dropped from the heap when it comes due

    def _watch(self, store: Renewable, leases: Sequence[Lease]) -> list[WatchedLease]:
        due = time.monotonic()
        watched = [WatchedLease(store, lease.keys, lease.token, lease.ms, due + lease.ms / 3000) for lease in leases]
        with self._lock:
            self._start_thread()
            first = self._heap[0][2] if self._heap else None
            for lease in watched:
                heapq.heappush(self._heap, (lease.due, next(self._order), lease))
            if watched and self._heap[0][2] is not first:  # due before any other: the thread must wake earlier
                self._changed.notify()
        return watched

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._changed.notify()

    def after_fork_in_child(self) -> None:
        """The parent's thread and the leases of its loads did not come along."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._heap, self._thread = [], None

    def _start_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="stampede-watchdog", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._closed:
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        # Due. Leases that are over go in one batch, but only now: dropping
                        # them as soon as they end would empty the heap after every short
                        # hold, and each next lease would have to wake this thread.
                        while self._heap and not self._heap[0][2].active:
                            heapq.heappop(self._heap)
                        if self._heap and self._heap[0][0] <= now:
                            break
                        continue
                    self._changed.wait(self._heap[0][0] - now if self._heap else None)
                if self._closed:
                    return
                _, _, lease = heapq.heappop(self._heap)
            self._renew(lease)
            if lease.active and not lease.lost:
                with self._lock:
                    heapq.heappush(self._heap, (lease.due, next(self._order), lease))

    @staticmethod
    def _renew(lease: WatchedLease) -> None:
        outcome: bool | BackendUnavailable
        try:
            outcome = lease.store.renew(lease.keys, lease.token, lease.lease_ms)
        except BackendUnavailable as error:
            outcome = error
        delay = next_renewal(lease.keys, lease.lease_ms, outcome)
        if delay is None:
            lease.lost = True
        else:
            lease.due = time.monotonic() + delay


def next_renewal(keys: EntryKeys, lease_ms: int, outcome: bool | BackendUnavailable) -> float | None:
    """Seconds until the next renewal after one attempt, or None once the lease is lost.
    Shared by this thread and the asyncio renewal task."""
    interval = lease_ms / 3000
    if isinstance(outcome, BackendUnavailable):
        _warn.warning(
            "stampede: cannot renew the lease of %r (%s); retrying",
            keys.value,
            outcome,
            key=keys.value,
            outcome="renew_failed",
        )
        return interval / 2
    if not outcome:
        _warn.warning(
            "stampede: the lease of %r was lost (invalidated, expired or taken over)",
            keys.lock,
            key=keys.value,
            outcome="lease_lost",
        )
        return None
    return interval


class RenewingTask:
    """An asyncio holder's lease renewed by a task (``keep_renewed``): ``stop`` cancels it."""

    def __init__(self, task: asyncio.Task[None]) -> None:
        self._task = task

    def stop(self) -> None:
        self._task.cancel()


class AsyncWatchdog:
    """``Watchdog`` for asyncio holders: each lease is renewed by a task of the holder's
    loop, so there is nothing to share, start or close."""

    @contextmanager
    def guard(self, store: AsyncRenewable, keys: EntryKeys, token: str, lease_ms: int) -> Iterator[RenewingTask]:
        """Keep the lease renewed for the duration of the ``with`` block."""
        with self.guard_many(store, [Lease(keys, token, lease_ms)]) as renewing:
            yield renewing

    def watch(self, store: AsyncRenewable, keys: EntryKeys, token: str, lease_ms: int) -> RenewingTask:
        """Keep the lease renewed until ``stop``."""
        return RenewingTask(asyncio.ensure_future(keep_renewed(store, keys, token, lease_ms)))

    @contextmanager
    def guard_many(self, store: AsyncRenewable, leases: Sequence[Lease]) -> Iterator[RenewingTask]:
        """``guard`` of each of ``leases`` (a batch's loads), by one task for them all."""
        renewing = RenewingTask(asyncio.ensure_future(keep_all_renewed(store, leases)))
        try:
            yield renewing
        finally:
            renewing.stop()


LOOP_WATCHDOG = AsyncWatchdog()


async def keep_renewed(store: AsyncRenewable, keys: EntryKeys, token: str, lease_ms: int) -> None:
    """Renew the lease every lease/3 until cancelled or lost (the watchdog's rules), for
    an asyncio holder: a task on its loop rather than the thread."""
    await keep_all_renewed(store, [Lease(keys, token, lease_ms)])


async def keep_all_renewed(store: AsyncRenewable, leases: Sequence[Lease]) -> None:
    """``keep_renewed`` for each of ``leases``, each on its own schedule, in one task (a
    batch's loads). A renewal runs as a task of its own only while it is sent, so that one
    waiting on a slow or failed server (a cluster primary of its own) holds none of the
    others back; a load that ends within a third of its lease starts none."""
    loop = asyncio.get_running_loop()
    now = loop.time()
    due = {index: now + lease.ms / 3000 for index, lease in enumerate(leases)}
    sending: set[asyncio.Task[None]] = set()

    async def renew(index: int) -> None:
        lease = leases[index]
        outcome: bool | BackendUnavailable
        try:
            outcome = await store.renew(lease.keys, lease.token, lease.ms)
        except BackendUnavailable as error:
            outcome = error
        delay = next_renewal(lease.keys, lease.ms, outcome)
        if delay is not None:
            due[index] = loop.time() + delay

    try:
        while due or sending:
            timeout = max(0.0, min(due.values()) - loop.time()) if due else None
            if sending:
                done, sending = await asyncio.wait(sending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # a renewal's own failure is BackendUnavailable, handled: anything else is a bug
            else:
                await asyncio.sleep(timeout or 0.0)
            now = loop.time()
            for index in [index for index, at in due.items() if at <= now]:
                del due[index]
                sending.add(asyncio.ensure_future(renew(index)))
    finally:
        for task in sending:
            task.cancel()
