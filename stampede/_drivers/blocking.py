"""The blocking driver: the hit path, the in-process singleflight, and the effects of the
flow performed with blocking calls (threads, or greenlets under gevent)."""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from typing import Any

from .._core.call import AwaitFlight, CallStep, Drive, Read, ReadForNear, ReadWithTTL, ReportStale, StartRefresh, call
from .._core.effects import Effect, Lease, milliseconds, unreachable
from .._core.flight import Flight
from .._core.flow import Context, Flow, LoaderSpec
from .._core.keys import EntryKeys
from .._core.store import Store
from .near import MISSING, NearCache
from .observe import Events, RateLimitedLog
from .perform import Performer, run
from .refresh import Refresher, report_stale
from .singleflight import FlightTable
from .watchdog import Watchdog


class SyncRunner:
    """Runs calls of blocking loaders against one store."""

    def __init__(
        self, store: Store, events: Events, warn: RateLimitedLog, watchdog: Watchdog, refreshes: int = 8
    ) -> None:
        self.store = store
        self.near: NearCache | None = None  # the layer's, if it has one
        self.flights = FlightTable()
        self.refresher = Refresher(refreshes, events, warn)
        self._events = events
        self._warn = warn
        self._watchdog = watchdog

    def call(self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The value of the entry, as ``_core.call.call`` decides, its steps performed
        with blocking calls. The near cache answers first, if it holds the value."""
        near = self.near
        if spec.near and near is not None:
            value = near.get(value_key, spec.codec, spec.near_shared)
            if value is not MISSING:
                return value
        decision = call(value_key, spec, self.flights, self._events, self._warn, spec.near and near is not None)
        return run(decision, functools.partial(self._step, value_key, spec, args, kwargs))

    def _step(
        self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any], step: CallStep
    ) -> Any:
        match step:
            case Read():
                return self.store.get(value_key)
            case ReadWithTTL(failing=failing):
                return self.store.get_with_ttl(value_key, failing)
            case ReadForNear():
                assert self.near is not None
                return self._read_for_near(self.near, value_key, spec)
            case AwaitFlight(flight=flight, timeout=timeout):
                return self.flights.wait(flight, timeout)
            case Drive(flow=flow, ctx=ctx, flight=flight):
                return self._drive(flow, ctx, functools.partial(spec.func, *args, **kwargs), flight)
            case StartRefresh(flow=flow, ctx=ctx, early=early):
                work = functools.partial(self._drive, flow, ctx, functools.partial(spec.func, *args, **kwargs))
                if self.refresher.start(value_key, work) and early:
                    self._events.incr("early_refreshes")
                return None
            case ReportStale():
                return report_stale()
            case _:
                unreachable(step)

    def _read_for_near(self, near: NearCache, value_key: str, spec: LoaderSpec) -> tuple[bytes | None, float, bool]:
        """Read the value with its TTL, and copy it into the near cache unless an
        invalidation of the key came in since the read began (see ``_drivers.near``)."""
        ticket = near.begin(value_key)
        try:
            raw, ttl_left, failing = self.store.get_with_ttl(value_key, spec.reads_failing)
        except BaseException:
            near.cancel(ticket)
            raise
        near.fill(ticket, raw, ttl_left, spec)
        return raw, ttl_left, failing

    def invalidate(self, keys: EntryKeys) -> None:
        self.store.invalidate(keys)

    def expire(self, keys: EntryKeys) -> None:
        self.store.expire(keys)

    def forget(self, key: str) -> None:
        """Detach the key's flight: later callers read afresh (after an invalidation)."""
        self.flights.forget(key)

    def _drive(self, flow: Flow, ctx: Context, loader: Callable[[], Any], flight: Flight | None = None) -> Any:
        """Perform the flow (``perform.run``) on a lease of a new token. The leader's
        ``flight`` counts the steps that may produce the value (see Flight)."""
        lease = Lease(ctx.keys, secrets.token_hex(16), milliseconds(ctx.settings.lock_ttl))
        with Performer(lease, store=self.store, loader=loader, watchdog=self._watchdog) as performer:
            if flight is None:
                return run(flow, performer)

            def perform(effect: Effect) -> Any:
                flight.count(effect)
                return performer(effect)

            value = run(flow, perform)
        flight.decided(ctx.unwritten, ctx.via_notice, ctx.served_stale, ctx.raw)
        return value
