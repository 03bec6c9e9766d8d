"""The blocking driver: the hit path, the in-process singleflight, and the effects of the
flow performed with blocking calls (threads, or greenlets under gevent)."""

from __future__ import annotations

import functools
import secrets
import time
from dataclasses import dataclass
from random import uniform
from typing import Any, Callable

from ._codec import Codec
from ._config import Settings
from ._errors import BackendUnavailable
from ._flow import (
    Acquire,
    AwaitNotice,
    Context,
    Flow,
    Load,
    Miss,
    Release,
    Subscribe,
    WriteRelease,
    after_wait_timeout,
    failed_read,
    fill,
    first_read,
)
from ._keys import EntryKeys
from ._notify import Subscription
from ._observe import RateLimitedLog, Stats
from ._singleflight import FlightTable
from ._store import Store
from ._watchdog import Watchdog


@dataclass(frozen=True)
class LoaderSpec:
    """What a driver needs to know of one decorated loader."""

    func: Callable[..., Any]
    settings: Settings
    codec: Codec


def milliseconds(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class SyncRunner:
    """Runs calls of blocking loaders against one store."""

    def __init__(self, store: Store, stats: Stats, warn: RateLimitedLog, watchdog: Watchdog) -> None:
        self.store = store
        self.flights = FlightTable()
        self._stats = stats
        self._warn = warn
        self._watchdog = watchdog

    def call(self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The value of the entry: from the cache, from another caller's read or load, or loaded.

        Of the callers of one key in this process, the first leads and the rest wait for
        its outcome: concurrent callers share one read, and on a miss one load. A leader
        stopped by something other than an Exception (KeyboardInterrupt, a killed greenlet)
        passes nothing on: those who waited start over, and one of them leads.
        """
        while True:
            flight, done = self.flights.join(value_key)
            if done is None:
                break
            if not done.wait(spec.settings.wait_timeout):
                ctx = self._context(value_key, spec)
                return self._drive(after_wait_timeout(ctx), ctx, functools.partial(spec.func, *args, **kwargs))
            if flight.error is None or isinstance(flight.error, Exception):
                self._stats.incr("collapsed")
                if flight.error is not None:
                    raise flight.error
                return flight.value
        try:
            value = self._lead(value_key, spec, args, kwargs)
        except BaseException as error:
            self.flights.finish(value_key, flight, error=error)
            raise
        self.flights.finish(value_key, flight, value=value)
        return value

    def _lead(self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            raw = self.store.get(value_key)
        except BackendUnavailable as error:
            found: Any = failed_read(self._stats, self._warn, error)
        else:
            found = first_read(raw, spec.codec, self._stats, self._warn, value_key)
            if not isinstance(found, Miss):
                return found
        ctx = self._context(value_key, spec)
        loader = functools.partial(spec.func, *args, **kwargs)
        return self._drive(fill(ctx, found), ctx, loader)

    def _context(self, value_key: str, spec: LoaderSpec) -> Context:
        keys = EntryKeys.for_value(value_key)
        return Context(keys, spec.settings, spec.codec, self._stats, self._warn, time.monotonic, time.time, uniform)

    def invalidate(self, keys: EntryKeys) -> None:
        try:
            self.store.invalidate(keys)
        finally:
            self.flights.forget(keys.value)

    def _drive(self, flow: Flow, ctx: Context, loader: Callable[[], Any]) -> Any:
        """Perform the flow's effects until it returns; every exception goes back into it."""
        keys, store = ctx.keys, self.store
        token = secrets.token_hex(16)
        lease_ms = milliseconds(ctx.settings.lock_ttl)
        subscription: Subscription | None = None
        reply: Any = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    effect = flow.send(reply) if error is None else flow.throw(error)
                except StopIteration as stop:
                    return stop.value
                reply, error = None, None
                try:
                    if isinstance(effect, Acquire):
                        reply = store.acquire(keys, token, lease_ms, effect.check_value)
                    elif isinstance(effect, AwaitNotice):
                        assert subscription is not None
                        reply = subscription.wait(effect.timeout)
                    elif isinstance(effect, Subscribe):
                        subscription = store.subscribe(keys)
                    elif isinstance(effect, Load):
                        if effect.leased:
                            with self._watchdog.guard(store, keys, token, lease_ms):
                                reply = loader()
                        else:
                            reply = loader()
                    elif isinstance(effect, WriteRelease):
                        ttl_ms = milliseconds(effect.ttl)
                        reply = store.write_release(keys, token, effect.envelope, ttl_ms, effect.inline)
                    elif isinstance(effect, Release):
                        store.release(keys, token)
                    else:  # pragma: no cover - a new effect without a driver branch
                        raise TypeError(f"unknown effect {effect!r}")
                except BaseException as raised:
                    error = raised
        finally:
            if subscription is not None:
                subscription.close()
