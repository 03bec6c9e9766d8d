"""Loads under a load budget (``_core.budget``): a loader wrapped so that each call
holds a slot of its budget while it runs, performed with awaits or with blocking calls
(``budget.py`` is generated from this module by ``.ci/unasync.py``).

The wrapper sits where the loader is called, so every kind of load goes through it: a
miss's, a background or early refresh's, a many-key loader's call (one slot per call,
not per id), a verification's, and the uncached load after a wait timeout. The caller
already holds its key's lease (renewed while it waits for the slot): the other callers
of the key wait for it as for any load, and cost the budget nothing. The loader runs
only while that lease is still its own: an invalidation while it waited took it, and
the loader does not run (``LeaseLost``), for its value could not be written and the
key's new holder loads it too. Where the lease lives in the budget's store
(``SlotLeaseStore``: one Redis server or Sentinel's master, PostgreSQL, the embedded
store) the store makes sure as it grants the slot, and a freed slot skips a waiter whose
lease is gone; elsewhere (a Redis Cluster, a lease service's servers) the load asks once
it has its slot (``LEASE_HELD``): one round trip more between one load and the next.

Taking a slot is ``_core.acquiring``'s decision, the named locks' (subscribe, try again,
wait for a message or a recheck, leave the queue when giving up), over the store's
``take_slot``. A waiter listens on a channel of its own: a freed slot wakes the first
waiter in line, not the whole queue (a storm has as many waiters as loads in flight).
A slot is renewed by the watchdog while the load runs. A store that cannot be reached
under ``on_backend_error="load"`` leaves the process to its own count: at most
``max_concurrent_loads`` of its loads at once (a semaphore per process, per event loop
for asyncio callers), so an outage does not lift the bound altogether.
"""

# budget.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

from .._core import world
from .._core.acquiring import acquiring
from .._core.budget import HOLDING, LoadBudget
from .._core.effects import AwaitNotice, Effect, LeaseLost, LeaveQueue, Release, Subscribe, TakeLock
from .._core.keys import EntryKeys
from .._core.observer import Reporter
from .._core.store import (
    GRANTED,
    LEASE_GONE,
    AcquireReply,
    AsyncSlotLeaseStore,
    AsyncStore,
    AsyncSubscription,
    LockState,
    Roles,
    roles_of,
)
from .._errors import BackendUnavailable, BudgetTimeout, ConfigError
from .aperform import LEASE_HELD, AsyncHeldLease, arun
from .budget_table import LocalCount
from .watchdog import AsyncWatchdog


class _AsyncSlotRenewal:
    """The watchdog's view of a slot: ``renew`` renews the slot, not an entry's lease."""

    def __init__(self, store: AsyncStore) -> None:
        self._store = store

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return await self._store.renew_slot(keys, token, lease_ms)


class _AsyncSlotPerformer:
    """Performs ``acquiring``'s effects on a budget's slots. A release that handed the
    slot to this waiter (``GRANTED``) answers its next take, without a round trip. With
    ``lease`` (a store that checks it: ``SlotLeaseStore``), every take and every grant
    is for that lease, and ``LeaseLost`` is raised once the store finds it gone.
    Closes its subscription."""

    def __init__(self, budget: LoadBudget, store: AsyncStore, token: str, lease: AsyncHeldLease | None) -> None:
        self._budget = budget
        self._store = store
        self._token = token
        self._lease = lease
        self._subscription: AsyncSubscription | None = None
        self._granted = False

    async def __call__(self, effect: Effect) -> Any:
        budget, store, token, lease = self._budget, self._store, self._token, self._lease
        match effect:
            case TakeLock():
                if self._granted:
                    return AcquireReply(LockState.LOCKED)
                if lease is None:
                    return await store.take_slot(budget.keys, token, budget.lease_ms, budget.queue_ms, budget.slots)
                taken = cast(AsyncSlotLeaseStore, store)
                reply = await taken.take_slot_for(
                    budget.keys, token, budget.lease_ms, budget.queue_ms, budget.slots, lease.keys, lease.token
                )
                if reply.state is LockState.LEASE_GONE:
                    raise LeaseLost()
                return reply
            case Subscribe():
                self._subscription = await store.subscribe(budget.keys.waiter(token))
                return None
            case AwaitNotice(timeout=timeout):
                assert self._subscription is not None, "AwaitNotice before Subscribe"
                message = await self._subscription.wait(timeout)
                if message == LEASE_GONE:
                    raise LeaseLost()  # told so in its turn, and out of the queue
                self._granted = message == GRANTED
                return message
            case Release() | LeaveQueue():  # either gives back what the token has (a slot handed to it too)
                return await store.release_slot(budget.keys, token, budget.slots, budget.lease_ms)
            case _:
                raise AssertionError(f"a budget's slot has no {effect!r}")

    def close(self) -> None:
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None


class AsyncBudgetSlots:
    """Slots of one budget for the callers of one world (the event loops, or the threads)."""

    def __init__(
        self,
        budget: LoadBudget,
        local: LocalCount,
        store: Callable[[], AsyncStore],
        watchdog: AsyncWatchdog,
        events: Reporter,
    ) -> None:
        self.budget = budget
        self._local = local  # the budget's count in this process, for a store out of reach
        self._store = store
        self._watchdog = watchdog
        self._events = events

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """A slot for the block (the load): taken first, renewed while the block runs,
        given back after it. ``BudgetTimeout`` when none comes free within wait_timeout."""
        budget = self.budget
        holding = HOLDING.get()
        if budget in holding:  # a load inside a load of this budget: it runs in the outer one's slot
            yield
            return
        store = self._store()
        if Roles.BUDGETS not in roles_of(store):  # a store of one's own, without BudgetStore
            raise ConfigError(f"max_concurrent_loads needs a store with load budgets; {type(store).__name__} has none")
        token = world.token(16)
        lease_held = LEASE_HELD.get()
        checked = lease_held if _checks_lease(store, lease_held) else None
        performer = _AsyncSlotPerformer(budget, store, token, checked)
        decision = acquiring(
            True, budget.wait_timeout, None, None, budget.recheck_interval, queue_lease=budget.lease_ms / 1000
        )
        started = world.monotonic()
        events = self._events
        events.began("budget_wait")
        events.budget(budget.name, 1, 0)
        outcome = "error"
        try:
            try:
                taken = await arun(decision, performer)
            except BackendUnavailable:
                if budget.raise_on_backend_error:
                    raise
                outcome = "local"
                taken = None
            except LeaseLost:
                outcome = "lease_lost"  # out of the queue, no slot (SlotLeaseStore)
                taken = None
            finally:
                performer.close()
            if outcome == "error":
                outcome = "slot" if taken is not None else "timeout"
        finally:
            waited = world.monotonic() - started
            events.ended("budget_wait", outcome, waited)
            events.budget_waited(budget.name, outcome, waited)
            events.budget(budget.name, -1, 1 if outcome == "slot" else 0)
        if outcome == "lease_lost":
            self._events.incr("budget_leases_lost")
            raise LeaseLost()
        if outcome == "timeout":
            self._events.incr("budget_timeouts")
            raise BudgetTimeout(budget.name, budget.wait_timeout)
        if outcome == "local":
            async with self._locally(started):
                yield
            return
        watched = self._watchdog.watch(_AsyncSlotRenewal(store), budget.keys, token, budget.lease_ms)
        inside = HOLDING.set(holding | {budget})
        lease = LEASE_HELD.set(None)  # for this load alone, not those inside it
        try:
            if lease_held is not None and checked is None and await _lease_gone(lease_held.held):
                # Invalidated while this load asked for its slot (in a queue, or in a store
                # slow to answer): its value could not be written, and whoever took the
                # lease since loads too. Its decision starts over.
                self._events.incr("budget_leases_lost")
                raise LeaseLost()
            yield
        finally:
            events.budget(budget.name, 0, -1)
            LEASE_HELD.reset(lease)
            HOLDING.reset(inside)
            watched.stop()
            try:
                # given back however the load ended (a cancelled task too)
                if True:  # ASYNC
                    await asyncio.shield(store.release_slot(budget.keys, token, budget.slots, budget.lease_ms))
                else:
                    store.release_slot(budget.keys, token, budget.slots, budget.lease_ms)
            except BackendUnavailable:
                pass  # the slot's lease, no longer renewed, gives it back within lock_ttl

    @asynccontextmanager
    async def _locally(self, started: float) -> AsyncIterator[None]:
        """The store failed: at most ``slots`` loads of this process (of this event loop)
        at once, waiting what is left of wait_timeout for one."""
        budget = self.budget
        self._events.incr("budget_unreachable")
        left = max(budget.wait_timeout - (world.monotonic() - started), 0.0)
        if True:  # ASYNC
            local = self._local.of_loop(asyncio.get_running_loop())
            try:
                await asyncio.wait_for(local.acquire(), left)
            except asyncio.TimeoutError:
                self._events.incr("budget_timeouts")
                raise BudgetTimeout(budget.name, budget.wait_timeout) from None
        else:
            local = self._local.threads
            if not local.acquire(timeout=left):
                self._events.incr("budget_timeouts")
                raise BudgetTimeout(budget.name, budget.wait_timeout)
        inside = HOLDING.set(HOLDING.get() | {budget})
        self._events.budget(budget.name, 0, 1)
        try:
            yield
        finally:
            self._events.budget(budget.name, 0, -1)
            HOLDING.reset(inside)
            local.release()


def _checks_lease(store: AsyncStore, lease: AsyncHeldLease | None) -> bool:
    """Whether ``store`` can make sure of ``lease`` as it grants a slot: the lease is the
    store's own (not a lease service's) and the store reads leases in its budget's steps."""
    return lease is not None and lease.home is store and Roles.SLOT_LEASES in roles_of(store)


async def _lease_gone(lease_held: Callable[[], Awaitable[bool]]) -> bool:
    """Whether a lease is no longer its caller's. A store that does not answer leaves
    that to the load's write, which is refused if so."""
    try:
        return not await lease_held()
    except BackendUnavailable:
        return False


def abudgeted(func: Callable[..., Awaitable[Any]], slots: AsyncBudgetSlots) -> Callable[..., Awaitable[Any]]:
    """``func``, each call holding a slot of the budget while it runs."""

    @functools.wraps(func)
    async def load(*args: Any, **kwargs: Any) -> Any:
        async with slots.held():
            return await func(*args, **kwargs)

    return load
