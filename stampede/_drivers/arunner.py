"""The asyncio driver: the hit path, the singleflight of one event loop, and the effects
of the flow performed with awaits. The decisions are the flow's and the flight's. This
module only performs I/O, like the blocking driver in ``_drivers.runner``.

Each event loop gets its own flight table and store (a redis.asyncio client and a
subscriber connection cannot be shared across loops). The store is closed when its loop
shuts down (or by ``Stampede.aclose()``). A loop closed without finalizing its async
generators has its state dropped when the next loop arrives.

Cancellation: a cancelled leader's CancelledError goes into the flow like any
interruption, so the lock is released (by token, shielded from a second cancellation)
before it propagates, and the tasks that joined its flight start over, one of them
leading. A cancelled joiner only cancels its own wait.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import math
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._core.batch import together
from .._core.call import DECIDED, Joiner, Outcome, read_found
from .._core.controls import ano_load, peeked, put, reload
from .._core.effects import Effect, Lease, milliseconds
from .._core.flight import Flight, fallback_key, refuse_recursion, shares_fallback
from .._core.flow import (
    Context,
    Flow,
    LoaderSpec,
    after_wait_timeout,
    failed_read,
    fill,
    new_context,
    refresh,
)
from .._core.freshness import Served
from .._core.keys import EntryKeys
from .._core.leases import ONE_SERVER, LeasePolicy
from .._core.many import Found, failed_reads, read_many, take_hits
from .._core.store import AsyncLockServers, AsyncStore
from .._errors import BackendUnavailable
from .._fork import reset_after_fork
from .abatched import AsyncBatchPerformer
from .aleases import AsyncLeases
from .aperform import AsyncPerformer, arun
from .batch import Entry, new_entry, performers_for
from .many import aone_of, batch_name, finish_entry, first_failure, near_many, refreshed
from .near import MISSING, NearCache
from .observe import Events, RateLimitedLog
from .refresh import report_stale, warn_refresh_raised
from .singleflight import AsyncFlightTable
from .timeouts import finish_started
from .trace import abackground, joining, lease_token
from .watchdog import LOOP_WATCHDOG

FINISH_TIMEOUT = 5.0  # the longest a loop's close waits for writes and releases under way


@dataclass
class LoopState:
    """What one event loop's callers share."""

    store: AsyncStore
    leases: AsyncLeases  # the layer's lease policy on this loop's store and lock servers
    flights: AsyncFlightTable = field(default_factory=AsyncFlightTable)
    closer: Any = None  # the async generator that closes the store when the loop shuts down
    starter: asyncio.Task[None] | None = None  # the task that starts it (kept: the loop holds tasks weakly)
    refreshes: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # background refresh per key
    closed: bool = False

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            refreshes = list(self.refreshes.values())
            for task in refreshes:
                task.cancel()  # the refresh releases its lease as any cancelled load does
            await asyncio.gather(*refreshes, return_exceptions=True)
            await finish_started(FINISH_TIMEOUT)  # their writes and releases, shielded, end first
            try:
                await self.store.aclose()
            finally:
                if self.leases.servers is not None:
                    await self.leases.servers.aclose()


class AsyncRunner:
    """Runs calls of async loaders against a store per event loop."""

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
        self.near: NearCache | None = None  # the layer's, if it has one
        self._events = events
        self.events = events  # what its calls' traces hear (``_drivers.trace``)
        self._warn = warn
        self._refresh_limit = refreshes
        self._lock = threading.Lock()  # loops may run in several threads
        self._loops: dict[asyncio.AbstractEventLoop, LoopState] = {}
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        """The parent's loops ran in threads that are not in this process. (Forking from
        inside a running loop is not supported: its tasks carry on in the child.)"""
        self._lock = threading.Lock()
        self._loops = {}

    async def call(self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The value of the entry, as ``Runner.call``, for the tasks of this loop."""
        near = self.near
        if spec.near and near is not None:
            value = near.get(value_key, spec.codec, spec.near_shared)
            if value is not MISSING:
                return value
        state = self._state()
        flights = state.flights
        joiner: Joiner | None = None  # made when a flight is in progress: hits make none
        while True:
            flight, leads = flights.join(value_key)
            if leads:
                break
            if joiner is None:
                joiner = Joiner(value_key, spec, self._events)
            timeout = joiner.joins(flight)
            try:
                joined = await flights.wait(flight, timeout)
            except BaseException:
                joiner.interrupted()  # this caller was cancelled
                raise
            joining(flight)  # its trace links to the leader's load
            value = joiner.outcome(flight, joined)
            if value is Outcome.START_OVER:
                continue
            if value is Outcome.TIMED_OUT:
                ctx = self._context(value_key, spec, args, kwargs)
                ctx.began = joiner.joined_first  # it shares a load without the lease begun after that
                loader = functools.partial(spec.func, *args, **kwargs)
                return await self._drive(after_wait_timeout(ctx), ctx, loader, state)
            if flight.stale:
                report_stale()
            return value
        if joiner is not None:
            joiner.leads()
        try:
            value = await self._lead(value_key, spec, args, kwargs, state, flight, joiner)
        except BaseException as error:
            flights.finish(value_key, flight, error=error)
            raise
        flights.finish(value_key, flight, value=value)
        if flight.stale:
            report_stale()
        return value

    async def _lead(
        self,
        value_key: str,
        spec: LoaderSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        state: LoopState,
        flight: Flight,
        joiner: Joiner | None = None,
    ) -> Any:
        """``Runner._lead``, awaited."""
        flight.sent, flight.codec = 1, spec.codec
        store = state.store
        near = self.near if spec.near else None
        ttl_left, failing = -1.0, False
        try:
            if near is not None:
                raw, ttl_left, failing = await self._read_for_near(near, store, value_key, spec)
            elif spec.reads_ttl:
                raw, ttl_left, failing = await store.get_with_ttl(value_key, spec.reads_failing)
            else:
                raw = await store.get(value_key)
        except BackendUnavailable as error:
            found: Any = failed_read(self._events, self._warn, error)
        else:
            found = read_found(flight, spec, raw, ttl_left, failing, self._events, self._warn, value_key, random.random)
            if type(found) not in DECIDED:
                return found  # a value, as it was read
            if isinstance(found, Served):
                if found.refresh is not None:
                    self._refresh(state, value_key, spec, args, kwargs, found)
                return found.value
        refuse_recursion(value_key)
        ctx = self._context(value_key, spec, args, kwargs)
        if joiner is not None:
            ctx.began = joiner.joined_first  # a load it waits for is bounded from there (load_soft_timeout)
        loader = functools.partial(spec.func, *args, **kwargs)
        return await self._drive(fill(ctx, found), ctx, loader, state, flight)

    async def call_many(
        self, keys: Sequence[str], spec: LoaderSpec, load: Callable[[list[int]], Awaitable[list[Any]]]
    ) -> list[Any]:
        """The values of many entries, as ``Runner.call_many``, for the tasks of this loop."""
        state = self._state()
        if not keys:
            return []
        if not spec.near and not spec.reads_ttl:  # a warm page: one MGET, one loop
            try:
                raws = await state.store.get_many(keys)
            except BackendUnavailable as error:
                return await self._call_many(
                    keys, spec, load, [MISSING] * len(keys), list(range(len(keys))), error, state
                )
            hits, missed = spec.codec.decode_hits(raws)
            self._events.incr("batch_reads")
            if not missed:
                self._events.incr("hits", len(hits))
                return hits
            return await self._call_many(
                keys, spec, load, [MISSING] * len(keys), list(range(len(keys))), None, state, (raws, hits)
            )
        values = [MISSING] * len(keys)
        return await self._call_many(keys, spec, load, values, near_many(self.near, keys, spec, values), None, state)

    async def _call_many(
        self,
        keys: Sequence[str],
        spec: LoaderSpec,
        load: Callable[[list[int]], Awaitable[list[Any]]],
        values: list[Any],
        wanted: list[int],
        failed: BackendUnavailable | None,
        state: LoopState,
        read: tuple[list[bytes | None], list[Any]] | None = None,
    ) -> list[Any]:
        """``Runner._call_many``, awaited."""
        absent: set[int] = set()
        if wanted and not spec.reads_ttl and failed is None:
            try:
                if read is None:
                    raws = [found[0] for found in await self._read_many([keys[index] for index in wanted], spec, state)]
                    read = raws, spec.codec.decode_hits(raws)[0]
                    self._events.incr("batch_reads")
            except BackendUnavailable as error:
                failed = error
            else:
                wanted = take_hits(*read, wanted, values, self._events, absent)
        led: dict[int, Flight] = {}
        joined: list[tuple[int, Flight]] = []
        for index in wanted:
            flight, leads = state.flights.join(keys[index])
            if leads:
                led[index] = flight
            else:
                joined.append((index, flight))
        waits = []  # each joined flight's future, made before any await: it may finish during this call's own
        try:
            for index, flight in joined:
                joiner = Joiner(keys[index], aone_of(spec, load, index), self._events)  # RecursiveLoad, at once
                waits.append((index, joiner, flight, state.flights.wait(flight, joiner.joins(flight))))
        except BaseException as error:
            for _, joiner, _, _ in waits:
                joiner.interrupted()  # its wait, reported begun, ends
            for index, flight in led.items():
                state.flights.finish(keys[index], flight, error=error)
            raise
        if led:
            await self._lead_many(keys, spec, load, led, values, state, failed, absent)
        for index, joiner, flight, done in waits:  # in flight here: waited for once this call's own are done
            values[index] = await self._wait_joined(keys[index], joiner, flight, done, state)
        return values

    async def _wait_joined(
        self, value_key: str, joiner: Joiner, flight: Flight, done: asyncio.Future[bool], state: LoopState
    ) -> Any:
        """``Runner._wait_joined``, awaited."""
        spec = joiner.spec
        try:
            joined = await done
        except BaseException:
            joiner.interrupted()
            raise
        value = joiner.outcome(flight, joined)
        if value is Outcome.TIMED_OUT:
            ctx = self._context(value_key, spec)
            ctx.began = joiner.joined_first
            return await self._drive(after_wait_timeout(ctx), ctx, spec.func, state)
        if value is Outcome.START_OVER:
            return await self.call(value_key, spec, (), {})  # its wait is bounded anew by wait_timeout
        return value

    async def _lead_many(
        self,
        keys: Sequence[str],
        spec: LoaderSpec,
        load: Callable[[list[int]], Awaitable[list[Any]]],
        led: dict[int, Flight],
        values: list[Any],
        state: LoopState,
        failed: BackendUnavailable | None,
        absent: set[int],
    ) -> None:
        """``Runner._lead_many``, awaited."""
        flights, unfinished = state.flights, dict(led)
        try:
            for flight in led.values():
                flight.sent, flight.codec = 1, spec.codec
            unread = [index for index in led if index not in absent]
            unread_keys = [keys[index] for index in unread]
            found = Found()
            try:
                if failed is not None:
                    raise failed
                reads = await self._read_many(unread_keys, spec, state) if unread else []
            except BackendUnavailable as error:
                self._events.incr("batch_reads")
                found = failed_reads(unread, self._events, self._warn, error)
            else:
                if unread:
                    self._events.incr("batch_reads")
                found = read_many(
                    unread, [led[index] for index in unread], spec, reads, unread_keys, self._events, self._warn,
                    random.random,
                )  # fmt: skip
            found.absent([index for index in led if index in absent], self._events)
            for index, value in found.values.items():
                values[index] = value
                flights.finish(keys[index], unfinished.pop(index), value=value)
            if found.refreshes:
                self._refresh_many(state, keys, spec, load, found.refreshes)
            if not found.misses:
                return
            misses = sorted(found.misses)  # the ids in the order asked
            for index in misses:
                refuse_recursion(keys[index])
            entries = [
                new_entry(index, self._context(keys[index], spec, (index,)), state.leases.policy, led[index])
                for index in misses
            ]
            flows = [fill(entry.ctx, found.misses[entry.position]) for entry in entries]

            def ended(index: int, outcome: Any) -> None:
                finish_entry(flights, keys, entries[index], outcome, unfinished, values)

            failure = first_failure(await self._drive_many(flows, entries, load, state, ended))
            if failure is not None:
                raise failure
        except BaseException as error:
            for index, flight in unfinished.items():
                flights.finish(keys[index], flight, error=error)
            raise

    async def _read_many(
        self, keys: list[str], spec: LoaderSpec, state: LoopState
    ) -> list[tuple[bytes | None, float, bool]]:
        """``Runner._read_many``, awaited."""
        near = self.near if spec.near else None
        if near is None:
            if spec.reads_ttl:
                return await state.store.get_many_with_ttl(keys, spec.reads_failing)
            return [(raw, -1.0, False) for raw in await state.store.get_many(keys)]
        tickets = [near.begin(key) for key in keys]
        try:
            reads = await state.store.get_many_with_ttl(keys, spec.reads_failing)
        except BaseException:
            for ticket in tickets:
                near.cancel(ticket)
            raise
        for ticket, (raw, ttl_left, _) in zip(tickets, reads, strict=True):
            near.fill(ticket, raw, ttl_left, spec)
        return reads

    def _refresh_many(
        self,
        state: LoopState,
        keys: Sequence[str],
        spec: LoaderSpec,
        load: Callable[[list[int]], Awaitable[list[Any]]],
        served: dict[int, Served],
    ) -> None:
        """Start one background refresh of every stale entry ``served`` in a task of this
        loop: one loader call (``_refresh``'s rules)."""
        name = batch_name(keys, served)
        if name in state.refreshes:
            return
        if len(state.refreshes) >= self._refresh_limit:
            self._events.incr("refreshes_skipped")
            return
        entries = [
            new_entry(index, self._context(keys[index], spec, (index,)), state.leases.policy, None) for index in served
        ]
        flows = [refresh(entry.ctx, *refreshed(served[entry.position])) for entry in entries]

        async def work() -> None:
            try:
                failure = first_failure(await self._drive_many(flows, entries, load, state))
                if failure is not None:
                    raise failure
            except Exception as error:
                warn_refresh_raised(self._warn, name, error)
            finally:
                state.refreshes.pop(name, None)

        task = contextvars.Context().run(asyncio.get_running_loop().create_task, abackground(work()))
        state.refreshes[name] = task
        early = sum(1 for found in served.values() if found.early)
        if early:
            self._events.incr("early_refreshes", early)

    async def _drive_many(
        self,
        flows: list[Flow],
        entries: list[Entry],
        load: Callable[[list[int]], Awaitable[list[Any]]],
        state: LoopState,
        ended: Callable[[int, Any], None] = lambda index, outcome: None,
    ) -> list[Any]:
        """``Runner._drive_many``, awaited."""
        leases = state.leases

        def performer(entry: Entry) -> AsyncPerformer:
            return AsyncPerformer(entry.lease, store=leases.store, servers=leases.servers, renewal=leases)

        perform = AsyncBatchPerformer(entries, leases.store, load, LOOP_WATCHDOG, leases, self._events)
        with performers_for(entries, performer):
            return await arun(together(flows, ended), perform)

    async def _read_for_near(
        self, near: NearCache, store: AsyncStore, value_key: str, spec: LoaderSpec
    ) -> tuple[bytes | None, float, bool]:
        """``Runner._read_for_near``, awaited."""
        ticket = near.begin(value_key)
        try:
            raw, ttl_left, failing = await store.get_with_ttl(value_key, spec.reads_failing)
        except BaseException:
            near.cancel(ticket)
            raise
        near.fill(ticket, raw, ttl_left, spec)
        return raw, ttl_left, failing

    def _refresh(
        self,
        state: LoopState,
        value_key: str,
        spec: LoaderSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        found: Served,
    ) -> None:
        """Start a background refresh of the value ``found`` in a task of this loop, as
        ``_drivers.refresh`` says: one per key, at most ``refreshes`` at once."""
        assert found.refresh is not None
        if value_key in state.refreshes:
            return
        if len(state.refreshes) >= self._refresh_limit:
            self._events.incr("refreshes_skipped")
            return
        ctx = self._context(value_key, spec, args, kwargs)
        loader = functools.partial(spec.func, *args, **kwargs)
        work = self._refreshing(state, value_key, refresh(ctx, found.refresh, found.life_left, found.raw), ctx, loader)
        # In a context of its own: not the caller's call (see _drivers.refresh).
        task = contextvars.Context().run(asyncio.get_running_loop().create_task, abackground(work))
        state.refreshes[value_key] = task
        if found.early:
            self._events.incr("early_refreshes")

    async def _refreshing(
        self, state: LoopState, value_key: str, flow: Flow, ctx: Context, loader: Callable[[], Awaitable[Any]]
    ) -> None:
        try:
            await self._drive(flow, ctx, loader, state)
        except Exception as error:
            warn_refresh_raised(self._warn, value_key, error)
        finally:
            state.refreshes.pop(value_key, None)

    def _context(
        self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Context:
        """A miss's context. ``args`` and ``kwargs``: the call's, which the entry's tags are
        rendered from (rendered on a miss only: a hit never needs them). A many-key call's
        are the entry's position (``_loader_many.PageTags``)."""
        tags = spec.tags.render(args, kwargs or {}) if spec.tags is not None else None
        return new_context(value_key, spec, self._events, self._warn, tags)

    def loop_store(self) -> AsyncStore:
        """The running event loop's store."""
        return self._state().store

    async def set(
        self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> bool:
        """``Runner.set``, for the tasks of this loop."""
        ctx = self._context(value_key, spec, args, kwargs)
        return bool(await self._drive(put(ctx, result), ctx, ano_load, self._state()))

    async def refresh(self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``Runner.refresh``, for the tasks of this loop."""
        refuse_recursion(value_key)
        ctx = self._context(value_key, spec, args, kwargs)
        return await self._drive(reload(ctx), ctx, functools.partial(spec.func, *args, **kwargs), self._state())

    async def peek(self, value_key: str, spec: LoaderSpec) -> tuple[Any, bool] | None:
        """``Runner.peek``, for the tasks of this loop."""
        store = self._state().store
        if not spec.reads_ttl:
            return peeked(await store.get(value_key), -1.0, False, spec.codec, spec.settings)
        raw, ttl_left, failing = await store.get_with_ttl(value_key, True)
        return peeked(raw, ttl_left, failing, spec.codec, spec.settings)

    async def invalidate(self, keys: EntryKeys) -> None:
        await self._state().leases.invalidate(keys)

    async def expire(self, keys: EntryKeys) -> None:
        await self._state().leases.expire(keys)

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

    def _state(self) -> LoopState:
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

    def _new_state(self) -> LoopState:
        servers = self._make_servers() if self._make_servers is not None else None  # a ConfigError before the store
        store = self._make_store()
        return LoopState(store, AsyncLeases(self._policy, store, servers))

    async def _closing_with(self, loop: asyncio.AbstractEventLoop, state: LoopState) -> AsyncIterator[None]:
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

    async def _unleased(
        self, state: LoopState, value_key: str, began: float, load: Callable[[], Awaitable[Any]]
    ) -> Any:
        """``Runner._unleased``, awaited: shared by the tasks of this event loop."""
        key = fallback_key(value_key)
        flights = state.flights
        while True:
            flight, leads = flights.join(key)
            if leads:
                break
            await flights.wait(flight, math.inf)
            if shares_fallback(flight, began):
                self._events.incr("collapsed")
                if flight.error is not None:
                    raise flight.error
                return flight.value
            # It began after that load did: the next one is its own, led or shared.
        flight.opened_at = time.monotonic()
        try:
            value = await load()
        except BaseException as error:
            flights.finish(key, flight, error=error)
            raise
        flights.finish(key, flight, value=value)
        return value

    async def _drive(
        self,
        flow: Flow,
        ctx: Context,
        loader: Callable[[], Awaitable[Any]],
        state: LoopState,
        flight: Flight | None = None,
    ) -> Any:
        """Perform the flow (``perform.arun``) on a lease of a new token, held where the
        layer's policy holds leases. The leader's ``flight`` counts the steps that may
        produce the value (see Flight)."""
        lease = Lease(ctx.keys, lease_token(ctx, flight), milliseconds(ctx.settings.lock_ttl))
        leases = state.leases
        ctx.leases = leases.policy.bind(lease)
        performer = AsyncPerformer(
            lease,
            store=leases.store,
            servers=leases.servers,
            loader=loader,
            renewal=leases,
            unleased=functools.partial(self._unleased, state, ctx.keys.value, ctx.began),
        )
        with performer:
            if flight is None:
                return await arun(flow, performer)

            def perform(effect: Effect) -> Awaitable[Any]:
                flight.count(effect)
                return performer(effect)

            value = await arun(flow, perform)
        flight.decided(ctx.unwritten, ctx.via_notice, ctx.served_stale, ctx.raw)
        return value


async def _start(generator: AsyncIterator[None]) -> None:
    await generator.__anext__()
