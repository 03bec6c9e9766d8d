"""The performer of every decision, and the one loop that drives decisions.

``arun`` sends a decision (``_core.effects``) the reply to its last effect, or throws in
the exception that effect raised, whatever it is (``BackendUnavailable``, the loader's
error, a cancellation, a KeyboardInterrupt), until the decision returns. A decision is
never closed while it may hold a lease: it sees every interruption and cleans up itself.

``AsyncPerformer`` maps each effect onto a store, the lock servers, the loader or the
clock. The ``match`` ends in ``unreachable``, so a new effect without a branch here fails
the type check.
"""

# perform.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
from __future__ import annotations

import asyncio
import functools

# SYNC: import time
from collections.abc import Awaitable, Callable, Generator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple, TypeVar, cast

from .._core.effects import (
    MUST_FINISH,
    Acquire,
    AwaitNotice,
    Effect,
    Expire,
    Finish,
    Hold,
    Invalidate,
    Lease,
    LeaveQueue,
    Load,
    LoadDetached,
    Pause,
    Put,
    ReadEntry,
    ReadEntryTags,
    ReadTagClock,
    ReadValue,
    Release,
    Renew,
    Seize,
    ServersDrop,
    ServersRelease,
    ServersRenew,
    ServersTake,
    ServersWatch,
    SettleNotice,
    Subscribe,
    TakeLock,
    Touch,
    WriteRelease,
    unreachable,
)
from .._core.flight import loading
from .._core.keys import EntryKeys
from .._core.results import refreshing
from .._core.store import AsyncLockServers, AsyncRenewable, AsyncStore, AsyncSubscription, AsyncWatchingServers
from .timeouts import abounded, afinish, cancel_count, shielded
from .watchdog import LOOP_WATCHDOG, AsyncWatchdog

T = TypeVar("T")
E = TypeVar("E")  # what a decision yields: an Effect, or a batch's step


class AsyncHeldLease(NamedTuple):
    """The lease a ``Load`` runs under: its entry, the caller's token, ``home``: the store
    that alone holds it (None where lock servers hold it: Redlock, ZooKeeper), and
    ``held``: whether it is still this caller's (renewing it)."""

    keys: EntryKeys
    token: str
    home: object | None
    held: Callable[[], Awaitable[bool]]


LEASE_HELD: ContextVar[AsyncHeldLease | None] = ContextVar("stampede_lease_held", default=None)
"""While a leased ``Load`` runs, its lease. A load that waited for a budget slot makes
sure before its loader runs (``_drivers.abudget``) that the lease is still its own: an
invalidation may have taken it meanwhile."""


@contextmanager
def lease_held(lease: AsyncHeldLease | None) -> Iterator[None]:
    """``LEASE_HELD`` is ``lease`` while the block runs (None: a load with no lease of its
    own, such as a many-key loader's call, asks nothing of a load it runs inside)."""
    token = LEASE_HELD.set(lease)
    try:
        yield
    finally:
        LEASE_HELD.reset(token)


async def arun(decision: Generator[E, Any, T], perform: Callable[[E], Awaitable[Any]]) -> T:
    """Perform ``decision``'s effects (or a batch's steps: ``_core.batch``). Return its outcome."""
    reply: Any = None
    error: BaseException | None = None
    if True:  # ASYNC
        # A cancellation of the task reaches the decision even where the client below
        # lost it: redis-py's Sentinel lookup (8.1), its read from one sentinel cut, asks
        # the next and returns normally, and a waiter so cancelled went on waiting. An
        # effect that ends normally while a cancellation not yet seen here is pending is
        # answered with CancelledError (Python 3.11+: a task counts its cancellations).
        cancels = cancel_count()
        asked = cancels()
    while True:
        try:
            effect = decision.send(reply) if error is None else decision.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply = error = None
        try:
            reply = await perform(effect)
        except BaseException as raised:
            error = raised
        if True:  # ASYNC
            if error is None and cancels() > asked:
                error = asyncio.CancelledError()  # lost below: see above
            if isinstance(error, asyncio.CancelledError):
                asked = cancels()  # seen: the decision's own clean-up goes on


class _Absent:
    """What a performer was not given: using it is a bug in the decision's caller."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise TypeError(f"this performer has no {self._what} (asked for {name!r})")


def _waker(subscription: AsyncSubscription | None) -> Callable[[], None] | None:
    """What wakes ``subscription`` as a message with no value would (its waiter re-checks).
    None for a subscription that cannot be woken by hand: it waits for its message."""
    assert subscription is not None, "ServersWatch before Subscribe"
    deliver: Callable[[bytes], None] | None = getattr(subscription, "deliver", None)
    return None if deliver is None else lambda: deliver(b"")


class AsyncPerformer:
    """Performs effects for one decision at a time: lease commands on ``store`` for
    ``lease``, lock-server commands on ``servers``, ``Load`` by calling ``loader`` (its
    lease renewed by ``watchdog`` through ``renewal``, the store unless the lease policy
    renews elsewhere too). A load without the lease goes through ``unleased`` (given the
    call to make), where the driver shares it among its process's callers
    (``_core.flight.fallback_key``). Closes its subscription on exit."""

    def __init__(
        self,
        lease: Lease | None = None,
        *,
        store: AsyncStore | None = None,
        servers: AsyncLockServers | None = None,
        loader: Callable[[], Awaitable[Any]] | None = None,
        watchdog: AsyncWatchdog | None = None,
        renewal: AsyncRenewable | None = None,
        unleased: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]] | None = None,
    ) -> None:
        self._unleased = unleased
        self._lease: Lease = lease if lease is not None else _Absent("lease")  # type: ignore[assignment]
        self._store: AsyncStore = store if store is not None else _Absent("store")
        self._servers: AsyncLockServers = servers if servers is not None else _Absent("lock servers")
        self._loader: Callable[[], Awaitable[Any]] = loader if loader is not None else _Absent("loader")  # type: ignore[assignment]
        if True:  # ASYNC
            self._watchdog = watchdog if watchdog is not None else LOOP_WATCHDOG  # a task per lease: always at hand
        else:
            self._watchdog = watchdog if watchdog is not None else cast(AsyncWatchdog, _Absent("watchdog"))
        self._renewal: AsyncRenewable = renewal if renewal is not None else self._store
        self._subscription: AsyncSubscription | None = None

    def __enter__(self) -> AsyncPerformer:
        return self

    def subscribed(self, subscription: AsyncSubscription) -> None:
        """The lease's subscription, made for it with others' (``_drivers.batch_entries``): as if
        its ``Subscribe`` had run here, and closed on exit as its own would be."""
        self._subscription = subscription

    def __exit__(self, *exc_info: object) -> None:
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    async def __call__(self, effect: Effect) -> Any:
        if True:  # ASYNC
            if isinstance(effect, MUST_FINISH):  # the write, releases: a cancellation does not cut them
                return await shielded(self._perform(effect))  # (a loop's close waits for them)
        return await self._perform(effect)

    async def _perform(self, effect: Effect) -> Any:
        lease, store = self._lease, self._store
        match effect:
            case Acquire(check_value=check_value, stale=stale):
                return await store.acquire(lease.keys, lease.token, lease.ms, check_value, stale, lease.clock)
            case TakeLock():
                return await store.take_lock(lease.keys, lease.token, lease.ms, lease.queue_ms)
            case ReadValue():
                return await store.get(lease.keys.value)
            case ReadEntry():
                return await store.get_with_ttl(lease.keys.value, failing=True)
            case Renew(lease_ms=lease_ms):
                return await store.renew(lease.keys, lease.token, lease_ms)
            case WriteRelease(envelope=envelope, ttl_ms=ttl_ms, inline=inline, tagged=tagged):
                return await store.write_release(lease.keys, lease.token, envelope, ttl_ms, inline, tagged)
            case Touch(identity=identity, ttl_ms=ttl_ms):
                return await store.touch(lease.keys, lease.token, identity, ttl_ms)
            case ReadTagClock(key=key):
                return await store.tag_clock(key)
            case ReadEntryTags():
                return await store.entry_tags(lease.keys)
            case Release():
                return await store.release(lease.keys, lease.token)
            case Hold(hold_ms=hold_ms, failing_ms=failing_ms):
                return await store.hold(lease.keys, lease.token, hold_ms, failing_ms)
            case LeaveQueue():
                return await store.leave_queue(lease.keys, lease.token)
            case Invalidate():
                return await store.invalidate(lease.keys)
            case Seize():
                return await store.seize(lease.keys, lease.token, lease.ms)
            case Put(envelope=envelope, ttl_ms=ttl_ms, inline=inline, tagged=tagged):
                return await store.put(lease.keys, lease.token, lease.ms, envelope, ttl_ms, inline, tagged)
            case Expire():
                return await store.expire(lease.keys)
            case Subscribe():
                self._subscription = await store.subscribe(lease.keys)
                return None
            case AwaitNotice(timeout=timeout):
                assert self._subscription is not None, "AwaitNotice before Subscribe"
                return await self._subscription.wait(timeout)
            case SettleNotice():
                assert self._subscription is not None, "SettleNotice before Subscribe"
                (await store.subscribe(lease.keys)).close()  # confirmed after every message published before it
                return await self._subscription.wait(0.0)
            case Load(leased=leased, timeout=timeout, detach=detach, previous=previous):
                with loading(lease.keys.value), refreshing(previous):
                    if not leased:
                        loader = functools.partial(abounded, self._loader, timeout, detach) if timeout else self._loader
                        with lease_held(None):  # not a lease of a load this one runs inside
                            return await (loader() if self._unleased is None else self._unleased(loader))
                    watched = self._watchdog.watch(self._renewal, lease.keys, lease.token, lease.ms)
                    detached = False
                    try:
                        renewal = self._renewal
                        home = store if renewal is store else getattr(renewal, "home", None)
                        held = functools.partial(renewal.renew, lease.keys, lease.token, lease.ms)
                        with lease_held(AsyncHeldLease(lease.keys, lease.token, home, held)):
                            return await (abounded(self._loader, timeout, detach) if timeout else self._loader())
                    except LoadDetached as late:
                        late.pending.stop, detached = watched.stop, True  # renewed until it is finished
                        raise
                    finally:
                        if not detached:
                            watched.stop()
            case Finish(pending=pending, then=then):
                later = AsyncPerformer(lease, store=store, servers=self._servers, renewal=self._renewal)
                return afinish(pending, then, lambda decision: arun(decision, later))
            case Pause(seconds=seconds):
                return await asyncio.sleep(seconds)
            case ServersTake(keys=keys, token=token, lease_ms=lease_ms):
                return await self._servers.take(keys, token, lease_ms)
            case ServersRenew(keys=keys, token=token, lease_ms=lease_ms):
                return await self._servers.renew(keys, token, lease_ms)
            case ServersRelease(keys=keys, token=token):
                return await self._servers.release(keys, token)
            case ServersDrop(keys=keys):
                return await self._servers.drop(keys)
            case ServersWatch(keys=keys):
                wake = _waker(self._subscription)
                return None if wake is None else await cast(AsyncWatchingServers, self._servers).watch(keys, wake)
            case _:
                unreachable(effect)
