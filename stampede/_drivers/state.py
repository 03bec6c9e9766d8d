"""Where a runner's shared state lives: the one place the blocking and the asyncio runner
differ in shape, written by hand side by side. The rest of the runner is one text
(``arunner.py``, and ``runner.py`` generated from it).

A blocking runner has one ``State`` for every thread of the process: a store, its lease
policy, one flight table, the refresher's worker threads and the layer's watchdog thread.
An asyncio runner has one ``AsyncState`` per event loop, made when a loop first calls: a
redis.asyncio client, a subscriber connection and a flight table cannot be shared across
loops. A loop's state is closed when the loop shuts down (or by ``Stampede.aclose()``). A
loop closed without finalizing its async generators has its state dropped when the next
loop arrives.

The asyncio runner reaches its state through ``self._state()``, which the generated
blocking runner reads as ``self.state`` (each room of the runner declares the rewrite:
``# UNASYNC: self._state() -> self.state``); both are built through the constructor here (a
store against a maker of stores, one per loop).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from .._core.leases import ONE_SERVER, LeasePolicy
from .._core.store import AsyncLockServers, AsyncStore, LockServers, Store
from .._core.verify import VERIFICATIONS_AT_ONCE
from .._fork import reset_after_fork
from .aleases import AsyncLeases
from .leases import Leases
from .near import NearCache
from .observe import Events, RateLimitedLog
from .refresh import AsyncRefresher, Refresher, SharedVerdicts
from .singleflight import AsyncFlightTable, FlightTable
from .timeouts import finish_started
from .tracing import GLOBAL, Tracing
from .watchdog import LOOP_WATCHDOG, AsyncWatchdog, Watchdog

FINISH_TIMEOUT = 5.0  # the longest a loop's close waits for writes and releases under way


@dataclass
class State:
    """What the blocking callers of one layer share."""

    store: Store
    leases: Leases  # the layer's lease policy on the store and lock servers
    watchdog: Watchdog  # the layer's thread renewing every lease in progress
    refresher: Refresher
    verifier: Refresher  # the verifications of sampled hits (``_core.verify``)
    verdicts: SharedVerdicts = field(default_factory=SharedVerdicts)  # those under way, by key
    flights: FlightTable = field(default_factory=FlightTable)


@dataclass
class AsyncState:
    """What the tasks of one event loop share."""

    store: AsyncStore
    leases: AsyncLeases  # the layer's lease policy on this loop's store and lock servers
    watchdog: AsyncWatchdog  # a task per lease in progress
    refresher: AsyncRefresher
    verifier: AsyncRefresher  # the verifications of sampled hits (``_core.verify``)
    verdicts: SharedVerdicts = field(default_factory=SharedVerdicts)  # those under way, by key
    flights: AsyncFlightTable = field(default_factory=AsyncFlightTable)
    closer: Any = None  # the async generator that closes the store when the loop shuts down
    starter: asyncio.Task[None] | None = None  # the task that starts it (kept: the loop holds tasks weakly)
    closed: bool = False

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            # Each step whatever the one before raised: a store left open leaves its
            # connections to be found by the garbage collector once the loop is gone.
            try:
                await self.refresher.aclose()  # a cancelled refresh releases its lease as any load does
                await self.verifier.aclose()
                await finish_started(FINISH_TIMEOUT)  # their writes and releases, shielded, end first
            finally:
                try:
                    await self.store.aclose()
                finally:
                    if self.leases.servers is not None:
                        await self.leases.servers.aclose()


class States:
    """The blocking runner's one state, and what every runner keeps beside it."""

    def __init__(
        self,
        store: Store,
        events: Events,
        warn: RateLimitedLog,
        watchdog: Watchdog,
        refreshes: int = 8,
        policy: LeasePolicy = ONE_SERVER,
        servers: LockServers | None = None,
    ) -> None:
        refresher = Refresher(refreshes, events, warn)
        verifier = Refresher(VERIFICATIONS_AT_ONCE, events, warn, skipped=None)
        self.state = State(store, Leases(policy, store, servers), watchdog, refresher, verifier)
        self.near: NearCache | None = None  # the layer's, if it has one
        self._events = events
        self.events = events  # what its calls' traces hear (``_drivers.tracing``)
        self.tracing: Tracing = GLOBAL  # which tracer its loaders' calls take (the layer's)
        self._warn = warn

    @property
    def store(self) -> Store:
        return self.state.store

    @property
    def leases(self) -> Leases:
        return self.state.leases

    @property
    def flights(self) -> FlightTable:
        return self.state.flights

    @property
    def refresher(self) -> Refresher:
        return self.state.refresher

    @property
    def verifier(self) -> Refresher:
        return self.state.verifier

    def forget(self, key: str) -> None:
        """Detach the key's flight: later callers read afresh (after an invalidation)."""
        self.state.flights.forget(key)


class AsyncStates:
    """The asyncio runner's state per event loop, and what every runner keeps beside it."""

    def __init__(
        self,
        make_store: Callable[[], AsyncStore],
        events: Events,
        warn: RateLimitedLog,
        refreshes: int = 8,
        policy: LeasePolicy = ONE_SERVER,
        make_servers: Callable[[], AsyncLockServers] | None = None,
    ) -> None:
        self._make_store = make_store
        self._policy = policy  # where a load's lease is held (``_core.leases``)
        self._make_servers = make_servers  # one loop's lock servers, if the policy has them
        self._refresh_limit = refreshes
        self.near: NearCache | None = None  # the layer's, if it has one
        self._events = events
        self.events = events  # what its calls' traces hear (``_drivers.tracing``)
        self.tracing: Tracing = GLOBAL  # which tracer its loaders' calls take (the layer's)
        self._warn = warn
        self._lock = threading.Lock()  # loops may run in several threads
        self._loops: dict[asyncio.AbstractEventLoop, AsyncState] = {}
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        """The parent's loops ran in threads that are not in this process. (Forking from
        inside a running loop is not supported: its tasks carry on in the child.)"""
        self._lock = threading.Lock()
        self._loops = {}

    def _state(self) -> AsyncState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            with self._lock:
                for closed in [other for other in self._loops if other.is_closed()]:
                    del self._loops[closed]
                state = self._loops.get(loop)
                if state is None:
                    state = self._loops[loop] = self._new_state()
                    state.closer = self._closing_with(loop, state)
                    state.starter = loop.create_task(_start(state.closer))
        return state

    def _new_state(self) -> AsyncState:
        servers = self._make_servers() if self._make_servers is not None else None  # a ConfigError before the store
        store = self._make_store()
        refresher = AsyncRefresher(self._refresh_limit, self._events, self._warn)
        verifier = AsyncRefresher(VERIFICATIONS_AT_ONCE, self._events, self._warn, skipped=None)
        return AsyncState(store, AsyncLeases(self._policy, store, servers), LOOP_WATCHDOG, refresher, verifier)

    def loop_store(self) -> AsyncStore:
        """The running event loop's store."""
        return self._state().store

    def forget(self, key: str) -> None:
        """Detach the key's flight in every loop (after an invalidation)."""
        for state in list(self._loops.values()):
            state.flights.forget(key)

    async def aclose(self) -> None:
        """Close this loop's store (its subscriber, and the client if the layer made it)."""
        with self._lock:
            state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state.aclose()

    def close(self) -> None:
        """Forget every loop's state. What is bound to a loop can only be closed in it."""
        with self._lock:
            self._loops.clear()

    async def _closing_with(self, loop: asyncio.AbstractEventLoop, state: AsyncState) -> AsyncIterator[None]:
        """Closes the loop's store when the loop shuts down: the loop finalizes the async
        generators it started (``asyncio.run`` does, via ``shutdown_asyncgens``), while it
        can still run the close. No task is left pending meanwhile."""
        try:
            yield
        finally:
            with self._lock:
                if self._loops.get(loop) is state:
                    del self._loops[loop]
            await state.aclose()


async def _start(generator: AsyncIterator[None]) -> None:
    await generator.__anext__()
