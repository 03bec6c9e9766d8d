"""Named locks: the cache's distributed lock as an API of its own.

``layer.lock(name)`` is a lease in the layer's store with a random token, taken by one
script that also draws a fencing token, released and extended only by compare-and-act
scripts, and renewed while held (the layer's watchdog thread, or a task per lock for
asyncio callers). What makes the textbook Redis locks fail cannot happen here:

* no SETNX-then-EXPIRE: the lease and its expiry are set in one command, so a holder that
  dies at any point leaves a lock that expires within ``ttl``.
* no release by a holder whose lease has run out: release and extend compare the token
  and act in one script. A holder that finds its lease gone gets ``LockLost``.
* no timestamp locks (SETNX + GETSET): expiry is the server's, no client clock decides.
* no sleep-spinning: a waiter subscribes to the lock's channel and is woken by the
  release, re-checking at the latest when the holder's lease would end.
* no lease shorter than the work: it is renewed every ttl/3 while held.
* a holder paused past its lease cannot be told apart by the lock alone, so every
  acquisition returns a fencing token, one greater than any before it for this name,
  which the protected resource can check to refuse a paused ex-holder's late write.

The decisions of acquiring are ``_core.acquiring.acquiring``, written once (no I/O).
``Lock`` performs them with blocking calls or with awaits (``_drivers.perform``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ._core import world
from ._core.acquiring import Acquiring, acquiring
from ._core.effects import Lease, milliseconds
from ._core.keys import EntryKeys, lock_keys
from ._core.store import AsyncStore, Store
from ._drivers.aperform import AsyncPerformer, arun
from ._drivers.perform import Performer, run
from ._drivers.watchdog import Watchdog, WatchedLease, keep_renewed
from ._errors import ConfigError, LockLost, LockNotOwned, WaitTimeout
from ._fork import reset_after_fork
from ._parts import LayerParts

log = logging.getLogger("stampede.lock")


@dataclass(eq=False)
class Acquisition:
    """One acquisition in Redis: what its holder (or holders, if reentrant) share."""

    token: str
    fence: int
    count: int = 1  # acquisitions by the same owner not yet released (reentrant locks)
    lease: WatchedLease | None = None  # the watchdog's record, for blocking holders
    renewal: asyncio.Future[None] | None = None  # the renewal task, for async holders

    def stop_renewing(self) -> None:
        if self.lease is not None:
            self.lease.active = False
        if self.renewal is not None:
            self.renewal.cancel()


class ReentrantHolds:
    """The reentrant locks held in this process, by (lock key, owner): an owner is a
    thread (or greenlet) or an asyncio task. Only the owner reads or writes its entries."""

    def __init__(self) -> None:
        self.holds: dict[tuple[str, Any], Acquisition] = {}
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        """The parent's holders are not in this process (a thread's ident can recur)."""
        self.holds = {}


def thread_owner() -> Any:
    return ("thread", threading.get_ident())


def task_owner() -> Any:
    return asyncio.current_task()


class LockContextManager:
    """``with`` and ``async with`` for a lock class with acquire/release (blocking) and
    aacquire/arelease (asyncio): a lock that cannot be taken raises ``WaitTimeout``. One
    lost by the time the block ends raises ``LockLost``, unless the block is already
    raising (its own error says more, and the loss is logged)."""

    name: str

    def acquire(self) -> bool:
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    async def aacquire(self) -> bool:
        raise NotImplementedError

    async def arelease(self) -> None:
        raise NotImplementedError

    def _timed_out(self) -> WaitTimeout:
        raise NotImplementedError

    def __enter__(self: HolderT) -> HolderT:
        if not self.acquire():
            raise self._timed_out()
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        try:
            self.release()
        except LockLost as lost:
            self._lost_on_exit(lost, exc_type)

    async def __aenter__(self: HolderT) -> HolderT:
        if not await self.aacquire():
            raise self._timed_out()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        try:
            await self.arelease()
        except LockLost as lost:
            self._lost_on_exit(lost, exc_type)

    def _lost_on_exit(self, lost: LockLost, exc_type: Any) -> None:
        if exc_type is None:
            raise lost
        log.warning("stampede: lock %r was lost while its block raised %s", self.name, exc_type.__name__)


HolderT = TypeVar("HolderT", bound=LockContextManager)


class Lock(LockContextManager):
    """A named lock over a layer's store, for threads (``with``, ``acquire``) and for
    tasks (``async with``, ``aacquire``). One object is one holder: make one per use
    (``layer.lock(name)`` is cheap). It is not shared between threads or tasks.

    ``fence`` is the fencing token of the current acquisition: greater than that of every
    earlier acquisition of this name, in any process.

    ``fair``: waiters take the lock in the order they first tried, through a queue in the
    store. A waiter that stops trying (it died) loses its place after ``ttl``.

    ``reentrant``: while a thread (or task) holds the lock, its further acquisitions of
    the name, through any ``Lock`` object of the layer, succeed at once without a round
    trip. The lock is released in Redis when every one of them has been released.
    """

    def __init__(
        self,
        name: str,
        keys: EntryKeys,
        *,
        ttl: float,
        blocking: bool,
        timeout: float | None,
        retry_interval: float | None,
        retries: int | None,
        renew: bool,
        reentrant: bool,
        fair: bool,
        recheck_interval: float,
        store: Store | None,
        async_store: Callable[[], AsyncStore] | None,
        watchdog: Watchdog,
        reentrant_holds: ReentrantHolds,
    ) -> None:
        if ttl <= 0:
            raise ConfigError(f"lock {name!r}: ttl must be > 0, got {ttl!r}")
        for option, value in (("timeout", timeout), ("retry_interval", retry_interval)):
            if value is not None and value < 0:
                raise ConfigError(f"lock {name!r}: {option} must be >= 0 or None, got {value!r}")
        if retries is not None and retries < 0:
            raise ConfigError(f"lock {name!r}: retries must be >= 0 or None, got {retries!r}")
        self.name = name
        self.keys = keys
        self.ttl = ttl
        self.blocking = blocking
        self.timeout = timeout
        self.retry_interval = retry_interval
        self.retries = retries
        self.renew = renew
        self.reentrant = reentrant
        self.fair = fair
        self._recheck_interval = recheck_interval
        self._store = store
        self._async_store = async_store
        self._watchdog = watchdog
        self._reentrant_holds = reentrant_holds
        self._acquisition: Acquisition | None = None  # while this object holds the lock
        self._owner: Any = None  # the reentrant owner that acquired through this object

    @property
    def token(self) -> str | None:
        """The random token of the lease in the store, while held."""
        return None if self._acquisition is None else self._acquisition.token

    @property
    def fence(self) -> int | None:
        """The fencing token of the current acquisition, while held."""
        return None if self._acquisition is None else self._acquisition.fence

    def __repr__(self) -> str:
        state = f"held, fence {self.fence}" if self.token else "not held"
        return f"<stampede.Lock {self.name!r} {state}>"

    # --- blocking ---------------------------------------------------------------------

    def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take the lock. True once held, False if not blocking or out of time or tries."""
        store = self._blocking_store()
        if self._reenter(thread_owner):
            return True
        token = world.token(16)
        with Performer(self._lease(token), store=store) as performer:
            fence = run(self._acquiring(blocking, timeout), performer)
        if fence is None:
            return False
        hold = self._held(token, fence, thread_owner)
        if self.renew:
            hold.lease = self._watchdog.watch(store, self.keys, token, milliseconds(self.ttl))
        return True

    def release(self) -> None:
        """Give the lock up. LockNotOwned if this object does not hold it. LockLost if its
        lease had already run out or been taken (the work under it was not protected)."""
        store = self._blocking_store()
        hold = self._give_up()
        if hold is not None and not store.release(self.keys, hold.token):
            raise self._lost("released")

    def extend(self, ttl: float | None = None) -> None:
        """Reset the lease to ``ttl`` (default: the lock's) from now, and renew it to that
        length from then on. LockLost if it is gone."""
        store = self._blocking_store()
        hold = self._held_acquisition()
        lease_ms = milliseconds(ttl or self.ttl)
        if not store.renew(self.keys, hold.token, lease_ms):
            self._give_up(entirely=True)
            raise self._lost("extended")
        if hold.lease is not None:
            hold.lease.lease_ms = lease_ms

    def locked(self) -> bool:
        """Whether anyone holds the lock now."""
        return self._blocking_store().holder(self.keys) is not None

    def owned(self) -> bool:
        """Whether this object holds the lock now, by the server's account."""
        return self.token is not None and self._blocking_store().holder(self.keys) == self.token

    # --- asyncio ----------------------------------------------------------------------

    async def aacquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """``acquire`` for a task."""
        store = self._loop_store()
        if self._reenter(task_owner):
            return True
        token = world.token(16)
        with AsyncPerformer(self._lease(token), store=store) as performer:
            fence = await arun(self._acquiring(blocking, timeout), performer)
        if fence is None:
            return False
        hold = self._held(token, fence, task_owner)
        if self.renew:
            hold.renewal = asyncio.ensure_future(keep_renewed(store, self.keys, token, milliseconds(self.ttl)))
        return True

    async def arelease(self) -> None:
        """``release`` for a task."""
        store = self._loop_store()
        hold = self._give_up()
        if hold is not None and not await asyncio.shield(store.release(self.keys, hold.token)):
            raise self._lost("released")

    async def aextend(self, ttl: float | None = None) -> None:
        """``extend`` for a task."""
        store = self._loop_store()
        hold = self._held_acquisition()
        lease_ms = milliseconds(ttl or self.ttl)
        if not await store.renew(self.keys, hold.token, lease_ms):
            self._give_up(entirely=True)
            raise self._lost("extended")
        if hold.renewal is not None:
            hold.renewal.cancel()
            hold.renewal = asyncio.ensure_future(keep_renewed(store, self.keys, hold.token, lease_ms))

    async def alocked(self) -> bool:
        return await self._loop_store().holder(self.keys) is not None

    async def aowned(self) -> bool:
        return self.token is not None and await self._loop_store().holder(self.keys) == self.token

    # --- shared -----------------------------------------------------------------------

    def _lease(self, token: str) -> Lease:
        ttl_ms = milliseconds(self.ttl)
        return Lease(self.keys, token, ttl_ms, queue_ms=ttl_ms if self.fair else 0)

    def _acquiring(self, blocking: bool | None, timeout: float | None) -> Acquiring:
        return acquiring(
            self.blocking if blocking is None else blocking,
            self.timeout if timeout is None else timeout,
            self.retry_interval,
            self.retries,
            self._recheck_interval,
            world.monotonic,
            queue_lease=self.ttl if self.fair else 0.0,
        )

    def _reenter(self, owner: Callable[[], Any]) -> bool:
        """Refuse a second acquisition through this object. For a reentrant lock its
        owner already holds, count one more and return True."""
        if self._acquisition is not None:
            raise LockNotOwned(f"lock {self.name!r} is already held by this Lock object", key=self.keys.lock)
        if not self.reentrant:
            return False
        key = (self.keys.lock, owner())
        hold = self._reentrant_holds.holds.get(key)
        if hold is None:
            return False
        hold.count += 1
        self._acquisition, self._owner = hold, key
        return True

    def _held(self, token: str, fence: int, owner: Callable[[], Any]) -> Acquisition:
        """Record a new acquisition in Redis."""
        hold = self._acquisition = Acquisition(token, fence)
        if self.reentrant:
            self._owner = (self.keys.lock, owner())
            self._reentrant_holds.holds[self._owner] = hold
        log.debug("lock %r acquired (fence %d)", self.name, fence)
        return hold

    def _held_acquisition(self) -> Acquisition:
        if self._acquisition is None:
            raise LockNotOwned(f"lock {self.name!r} is not held by this Lock object", key=self.keys.lock)
        return self._acquisition

    def _give_up(self, entirely: bool = False) -> Acquisition | None:
        """Forget this object's acquisition. Return the hold if it is to be released in
        the store now (the last of a reentrant owner's, or ``entirely``), else None."""
        hold = self._held_acquisition()
        self._acquisition = None
        hold.count = 0 if entirely else max(hold.count - 1, 0)
        if hold.count > 0:
            return None
        if self._owner is not None and self._reentrant_holds.holds.get(self._owner) is hold:
            del self._reentrant_holds.holds[self._owner]
        self._owner = None
        hold.stop_renewing()
        return hold

    def _lost(self, what: str) -> LockLost:
        return LockLost(
            f"lock {self.name!r} could not be {what}: its lease had run out or been taken over, "
            "so the work done under it may have overlapped another holder's",
            key=self.keys.lock,
        )

    def _timed_out(self) -> WaitTimeout:
        return WaitTimeout(
            f"could not acquire lock {self.name!r} (blocking={self.blocking}, timeout={self.timeout}, "
            f"retries={self.retries})",
            key=self.keys.lock,
        )

    def _blocking_store(self) -> Store:
        if self._store is None:
            raise ConfigError(f"lock {self.name!r}: this layer has no blocking client; use the async methods")
        return self._store

    def _loop_store(self) -> AsyncStore:
        if self._async_store is None:
            raise ConfigError(f"lock {self.name!r}: this layer has no asyncio client; use the blocking methods")
        return self._async_store()


class Locks:
    """A layer's named locks (``Stampede.lock``) and PostgreSQL's advisory locks
    (``Stampede.advisory_lock``), over the layer's parts: where its backend keeps named
    locks (a lock service's queue makes every lock fair), its watchdog, and the
    reentrant holds of this process."""

    def __init__(self, parts: LayerParts) -> None:
        self._parts = parts
        self._reentrant_holds = ReentrantHolds()

    def lock(self, name: str, ttl: float | None, fair: bool, **options: Any) -> Lock:
        """``Stampede.lock``: ``options`` are ``Lock``'s, as the caller gave them."""
        parts = self._parts
        settings, backend = parts.settings, parts.backend
        return Lock(
            name,
            lock_keys(parts.namespace, name, settings.max_key_length),
            ttl=settings.lock_ttl if ttl is None else ttl,
            fair=fair or backend.lock_queue is not None,
            recheck_interval=settings.recheck_interval,
            store=backend.named_lock_store(parts.runner.store) if parts.runner is not None else None,
            async_store=self._async_store if parts.async_runner is not None else None,
            watchdog=parts.watchdog,
            reentrant_holds=self._reentrant_holds,
            **options,
        )

    def advisory_lock(self, name: str, blocking: bool, timeout: float | None) -> Any:
        parts = self._parts
        make = parts.backend.advisory_lock
        if make is None:
            raise ConfigError("advisory_lock() needs a layer whose store is PostgreSQL")
        loop_store = parts.async_runner.loop_store if parts.async_runner is not None else None
        return make(parts.namespace, name, blocking=blocking, timeout=timeout, loop_store=loop_store)

    def _async_store(self) -> AsyncStore:
        """The running loop's store for named locks (a lock service's, where it has one)."""
        parts = self._parts
        assert parts.async_runner is not None
        store: AsyncStore = parts.backend.async_named_lock_store(parts.async_runner.loop_store())
        return store
