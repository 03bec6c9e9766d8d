# Generated from aperform.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""The performer of every decision, and the one loop that drives decisions.

``run`` sends a decision (``_core.effects``) the reply to its last effect, or throws in
the exception that effect raised, whatever it is (``BackendUnavailable``, the loader's
error, a cancellation, a KeyboardInterrupt), until the decision returns. A decision is
never closed while it may hold a lease: it sees every interruption and cleans up itself.

``Performer`` maps each effect onto a store, the lock servers, the loader or the
clock. The ``match`` ends in ``unreachable``, so a new effect without a branch here fails
the type check.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple, TypeVar, cast

from .._core.effects import (
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
from .._core.store import LockServers, Renewable, Store, Subscription, WatchingServers
from .timeouts import bounded, finish
from .watchdog import Watchdog

T = TypeVar("T")
E = TypeVar("E")  # what a decision yields: an Effect, or a batch's step


class HeldLease(NamedTuple):
    """The lease a ``Load`` runs under: its entry, the caller's token, ``home``: the store
    that alone holds it (None where lock servers hold it: Redlock, ZooKeeper), and
    ``held``: whether it is still this caller's (renewing it)."""

    keys: EntryKeys
    token: str
    home: object | None
    held: Callable[[], bool]


LEASE_HELD: ContextVar[HeldLease | None] = ContextVar("stampede_lease_held", default=None)
"""While a leased ``Load`` runs, its lease. A load that waited for a budget slot makes
sure before its loader runs (``_drivers.budget``) that the lease is still its own: an
invalidation may have taken it meanwhile."""


@contextmanager
def lease_held(lease: HeldLease | None) -> Iterator[None]:
    """``LEASE_HELD`` is ``lease`` while the block runs (None: a load with no lease of its
    own, such as a many-key loader's call, asks nothing of a load it runs inside)."""
    token = LEASE_HELD.set(lease)
    try:
        yield
    finally:
        LEASE_HELD.reset(token)


def run(decision: Generator[E, Any, T], perform: Callable[[E], Any]) -> T:
    """Perform ``decision``'s effects (or a batch's steps: ``_core.batch``). Return its outcome."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = decision.send(reply) if error is None else decision.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        reply = error = None
        try:
            reply = perform(effect)
        except BaseException as raised:
            error = raised


class _Absent:
    """What a performer was not given: using it is a bug in the decision's caller."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise TypeError(f"this performer has no {self._what} (asked for {name!r})")


def _waker(subscription: Subscription | None) -> Callable[[], None] | None:
    """What wakes ``subscription`` as a message with no value would (its waiter re-checks).
    None for a subscription that cannot be woken by hand: it waits for its message."""
    assert subscription is not None, "ServersWatch before Subscribe"
    deliver: Callable[[bytes], None] | None = getattr(subscription, "deliver", None)
    return None if deliver is None else lambda: deliver(b"")


class Performer:
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
        store: Store | None = None,
        servers: LockServers | None = None,
        loader: Callable[[], Any] | None = None,
        watchdog: Watchdog | None = None,
        renewal: Renewable | None = None,
        unleased: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        self._unleased = unleased
        self._lease: Lease = lease if lease is not None else _Absent("lease")  # type: ignore[assignment]
        self._store: Store = store if store is not None else _Absent("store")
        self._servers: LockServers = servers if servers is not None else _Absent("lock servers")
        self._loader: Callable[[], Any] = loader if loader is not None else _Absent("loader")  # type: ignore[assignment]
        self._watchdog = watchdog if watchdog is not None else cast(Watchdog, _Absent("watchdog"))
        self._renewal: Renewable = renewal if renewal is not None else self._store
        self._subscription: Subscription | None = None

    def __enter__(self) -> Performer:
        return self

    def subscribed(self, subscription: Subscription) -> None:
        """The lease's subscription, made for it with others' (``_drivers.batch_entries``): as if
        its ``Subscribe`` had run here, and closed on exit as its own would be."""
        self._subscription = subscription

    def __exit__(self, *exc_info: object) -> None:
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    def __call__(self, effect: Effect) -> Any:
        return self._perform(effect)

    def _perform(self, effect: Effect) -> Any:
        lease, store = self._lease, self._store
        match effect:
            case Acquire(check_value=check_value, stale=stale):
                return store.acquire(lease.keys, lease.token, lease.ms, check_value, stale, lease.clock)
            case TakeLock():
                return store.take_lock(lease.keys, lease.token, lease.ms, lease.queue_ms)
            case ReadValue():
                return store.get(lease.keys.value)
            case ReadEntry():
                return store.get_with_ttl(lease.keys.value, failing=True)
            case Renew(lease_ms=lease_ms):
                return store.renew(lease.keys, lease.token, lease_ms)
            case WriteRelease(envelope=envelope, ttl_ms=ttl_ms, inline=inline, tagged=tagged):
                return store.write_release(lease.keys, lease.token, envelope, ttl_ms, inline, tagged)
            case Touch(identity=identity, ttl_ms=ttl_ms):
                return store.touch(lease.keys, lease.token, identity, ttl_ms)
            case ReadTagClock(key=key):
                return store.tag_clock(key)
            case ReadEntryTags():
                return store.entry_tags(lease.keys)
            case Release():
                return store.release(lease.keys, lease.token)
            case Hold(hold_ms=hold_ms, failing_ms=failing_ms):
                return store.hold(lease.keys, lease.token, hold_ms, failing_ms)
            case LeaveQueue():
                return store.leave_queue(lease.keys, lease.token)
            case Invalidate():
                return store.invalidate(lease.keys)
            case Seize():
                return store.seize(lease.keys, lease.token, lease.ms)
            case Put(envelope=envelope, ttl_ms=ttl_ms, inline=inline, tagged=tagged):
                return store.put(lease.keys, lease.token, lease.ms, envelope, ttl_ms, inline, tagged)
            case Expire():
                return store.expire(lease.keys)
            case Subscribe():
                self._subscription = store.subscribe(lease.keys)
                return None
            case AwaitNotice(timeout=timeout):
                assert self._subscription is not None, "AwaitNotice before Subscribe"
                return self._subscription.wait(timeout)
            case SettleNotice():
                assert self._subscription is not None, "SettleNotice before Subscribe"
                (store.subscribe(lease.keys)).close()  # confirmed after every message published before it
                return self._subscription.wait(0.0)
            case Load(leased=leased, timeout=timeout, detach=detach, previous=previous):
                with loading(lease.keys.value), refreshing(previous):
                    if not leased:
                        loader = functools.partial(bounded, self._loader, timeout, detach) if timeout else self._loader
                        with lease_held(None):  # not a lease of a load this one runs inside
                            return loader() if self._unleased is None else self._unleased(loader)
                    watched = self._watchdog.watch(self._renewal, lease.keys, lease.token, lease.ms)
                    detached = False
                    try:
                        renewal = self._renewal
                        home = store if renewal is store else getattr(renewal, "home", None)
                        held = functools.partial(renewal.renew, lease.keys, lease.token, lease.ms)
                        with lease_held(HeldLease(lease.keys, lease.token, home, held)):
                            return bounded(self._loader, timeout, detach) if timeout else self._loader()
                    except LoadDetached as late:
                        late.pending.stop, detached = watched.stop, True  # renewed until it is finished
                        raise
                    finally:
                        if not detached:
                            watched.stop()
            case Finish(pending=pending, then=then):
                later = Performer(lease, store=store, servers=self._servers, renewal=self._renewal)
                return finish(pending, then, lambda decision: run(decision, later))
            case Pause(seconds=seconds):
                return time.sleep(seconds)
            case ServersTake(keys=keys, token=token, lease_ms=lease_ms):
                return self._servers.take(keys, token, lease_ms)
            case ServersRenew(keys=keys, token=token, lease_ms=lease_ms):
                return self._servers.renew(keys, token, lease_ms)
            case ServersRelease(keys=keys, token=token):
                return self._servers.release(keys, token)
            case ServersDrop(keys=keys):
                return self._servers.drop(keys)
            case ServersWatch(keys=keys):
                wake = _waker(self._subscription)
                return None if wake is None else cast(WatchingServers, self._servers).watch(keys, wake)
            case _:
                unreachable(effect)
