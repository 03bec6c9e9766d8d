"""One key's call: the hit path, the in-process singleflight (the first caller of a key
leads, the rest wait for its outcome), a miss filled (``flow.fill``), and the background
refresh of a hit served stale.

Interruptions: a leader stopped by something other than an Exception (a cancelled task,
a KeyboardInterrupt, a killed greenlet) passes it into the flow like any interruption, so
the lock is released (by token, shielded from a second cancellation) before it
propagates. Those who joined its flight start over, and one of them leads. An interrupted
joiner only ends its own wait.
"""

# one_key.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
# UNASYNC: self._state() -> self.state
from __future__ import annotations

import functools
from typing import Any

from .._core import world
from .._core.call import DECIDED, Joiner, Outcome, read_found
from .._core.flight import Flight, refuse_recursion
from .._core.flow import (
    LoaderSpec,
    after_wait_timeout,
    failed_read,
    fill,
    refresh,
)
from .._core.freshness import Served
from .._core.store import AsyncStore
from .._errors import BackendUnavailable
from .averify import AsyncVerifying
from .near import MISSING, NearCache
from .refresh import report_stale
from .state import AsyncState
from .tracing import joining


class AsyncOneKey(AsyncVerifying):
    """Runs the calls of a loader of one key."""

    async def call(self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The value of the entry: from the cache, from another caller's read or load, or loaded.

        Of the callers of one key in this process (on this event loop), the first leads
        and the rest wait for its outcome: concurrent callers share one read, and on a
        miss one load.
        """
        near = self.near
        if spec.near and near is not None:
            value = near.get(value_key, spec.codec, spec.near_shared)
            if value is not MISSING:
                if spec.verify is not None and spec.verify.due():
                    self._verify_near(near, value_key, spec, args, kwargs)
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
                joiner.interrupted()  # a cancelled task, a KeyboardInterrupt, a killed greenlet
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
        state: AsyncState,
        flight: Flight,
        joiner: Joiner | None = None,
    ) -> Any:
        """Lead ``flight``: read, and on a miss fill (``flow.fill``). ``joiner``: the
        caller's waits before it led (it started over), from whose first its bounds run."""
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
            found = read_found(flight, spec, raw, ttl_left, failing, self._events, self._warn, value_key, world.random)
            if type(found) not in DECIDED:
                if spec.verify is not None and raw is not None and spec.verify.due():
                    self._verify(state, value_key, spec, functools.partial(spec.func, *args, **kwargs), raw)
                return found  # a value, as it was read
            if isinstance(found, Served):
                if found.refresh is not None:
                    self._refresh(state, value_key, spec, args, kwargs, found)
                if not found.stale and spec.verify is not None and raw is not None and spec.verify.due():
                    self._verify(state, value_key, spec, functools.partial(spec.func, *args, **kwargs), raw)
                return found.value
        refuse_recursion(value_key)
        ctx = self._context(value_key, spec, args, kwargs)
        if joiner is not None:
            ctx.began = joiner.joined_first  # a load it waits for is bounded from there (load_soft_timeout)
        loader = functools.partial(spec.func, *args, **kwargs)
        return await self._drive(fill(ctx, found), ctx, loader, state, flight)

    async def _read_for_near(
        self, near: NearCache, store: AsyncStore, value_key: str, spec: LoaderSpec
    ) -> tuple[bytes | None, float, bool]:
        """Read the value with its TTL, and copy it into the near cache unless an
        invalidation of the key came in since the read began (see ``_drivers.near``)."""
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
        state: AsyncState,
        value_key: str,
        spec: LoaderSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        found: Served,
    ) -> None:
        """Start a background refresh of the value ``found``, as ``_drivers.refresh``
        says: one per key, at most ``refreshes`` at once."""
        assert found.refresh is not None
        if state.refresher.busy(value_key):
            return
        ctx = self._context(value_key, spec, args, kwargs)
        loader = functools.partial(spec.func, *args, **kwargs)
        flow = refresh(ctx, found.refresh, found.life_left, found.raw)
        work = functools.partial(self._drive, flow, ctx, loader, state)
        if state.refresher.start(value_key, work) and found.early:
            self._events.incr("early_refreshes")
