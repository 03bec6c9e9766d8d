"""One call of a cached loader, written once (sans-IO): join the key's flight or lead it,
read, classify what was read, start a refresh, or fill the entry.

``call`` is a decision like the flow's, at the level above it. It yields steps
(``CallStep``), and the blocking and asyncio drivers perform them with
``_drivers.perform.run`` or ``arun``: wait for a flight, one of three reads, start a
background refresh, drive a flow (``_core.flow``) on a lease. So the order of a call
(deadline, start over, what to read, serve, refresh or fill) has one source, and a
driver only performs I/O.

The near cache's own hit is the drivers' first line, before any of this: it does no
I/O, and a decision there would cost more than the hit.
"""

from __future__ import annotations

import random
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Protocol

from .._errors import BackendUnavailable
from .codec import NOT_A_VALUE
from .flight import Flight, refuse_recursion, take_shared
from .flow import (
    Context,
    Flow,
    LoaderSpec,
    Miss,
    WarningLog,
    after_wait_timeout,
    failed_read,
    fill,
    first_read,
    fresh_read,
    new_context,
    refresh,
)
from .freshness import Served
from .observer import Reporter, Wait


class Flights(Protocol):
    """A driver's table of open flights (``_drivers.singleflight``)."""

    def join(self, key: str) -> tuple[Flight, bool]: ...

    def finish(self, key: str, flight: Flight, value: Any = None, error: BaseException | None = None) -> None: ...


class Waits(Reporter, Protocol):
    """A reporter that also makes a caller's wait (``_drivers.observe.Events``)."""

    def waiting(self) -> Wait: ...


# --- the steps a driver performs ------------------------------------------------------


# The reads are of the call's own key, which its driver knows: each is one object made
# once, so that a hit allocates no step.


@dataclass(frozen=True, slots=True)
class Read:
    """GET the value. Reply: its bytes, or None."""


@dataclass(frozen=True, slots=True)
class ReadWithTTL:
    """Read the value with its TTL (and the failing mark, if ``failing``).
    Reply: ``(raw, ttl_left, failing)``."""

    failing: bool


@dataclass(frozen=True, slots=True)
class ReadForNear:
    """``ReadWithTTL``, copied into the near cache unless an invalidation of the key came
    in while it was read (``_drivers.near``)."""


READ = Read()
READ_WITH_TTL = ReadWithTTL(False)
READ_WITH_TTL_FAILING = ReadWithTTL(True)
READ_FOR_NEAR = ReadForNear()


@dataclass(frozen=True, slots=True)
class AwaitFlight:
    """Wait for the flight's leader. Reply: True once it finished, False after ``timeout``."""

    flight: Flight
    timeout: float


@dataclass(frozen=True, slots=True)
class StartRefresh:
    """Hand ``flow`` (a background refresh of the key) to the driver's refresher. It
    counts ``early_refreshes`` when it starts an ``early`` one. Reply: None."""

    flow: Flow
    ctx: Context
    early: bool


@dataclass(frozen=True, slots=True)
class Drive:
    """Perform ``flow`` on a lease of a new token, with the caller's loader. The leader's
    ``flight`` counts the steps that may produce the value. Reply: the flow's outcome."""

    flow: Flow
    ctx: Context
    flight: Flight | None


@dataclass(frozen=True, slots=True)
class ReportStale:
    """The value about to be returned is stale (``fetch()`` tells its caller). Reply: None."""


REPORT_STALE = ReportStale()

CallStep = Read | ReadWithTTL | ReadForNear | AwaitFlight | StartRefresh | Drive | ReportStale
Call = Generator[CallStep, Any, Any]


def call(value_key: str, spec: LoaderSpec, flights: Flights, events: Waits, warn: WarningLog, near: bool) -> Call:
    """The value of the entry: from the cache, from another caller's read or load, or loaded.
    ``near``: the read fills the layer's near cache.

    Of the callers of one key in this process (this event loop), the first leads and the
    rest wait for its outcome: concurrent callers share one read, and on a miss one load.
    A leader stopped by something other than an Exception (KeyboardInterrupt, a cancelled
    task, a killed greenlet) passes nothing on: those who waited start over, and one of
    them leads.
    """
    deadline = 0.0
    wait: Wait | None = None  # for another caller's read or load (made when one starts: hits make none)
    early = False  # after starting over: early for every flight (see _core.flight)
    while True:
        flight, leads = flights.join(value_key)
        if leads:
            break
        refuse_recursion(value_key)
        joined_at = None if early else flight.sent
        if not deadline:
            deadline = time.monotonic() + spec.settings.wait_timeout
        if wait is None:
            wait = events.waiting()
        try:
            joined = yield AwaitFlight(flight, max(0.0, deadline - time.monotonic()))
        except BaseException:
            wait.end("error")  # interrupted (KeyboardInterrupt, a cancelled task, a killed greenlet)
            raise
        if not joined:
            wait.end("timeout")
            ctx = new_context(value_key, spec, events, warn)
            return (yield Drive(after_wait_timeout(ctx), ctx, None))
        if flight.starts_over(joined_at):
            early = True
            continue
        value = take_shared(flight, spec, wait, events)
        if value is NOT_A_VALUE:
            early = True
            continue
        if flight.stale:
            yield REPORT_STALE
        return value
    if wait is not None:
        wait.end("retry")  # what it waited for predated an invalidation: this caller leads now
    # Leading: read, then return what was read, or fill the entry. One generator (no
    # ``yield from`` a second one): a hit's cost here is paid on every call.
    try:
        flight.sent, flight.codec = 1, spec.codec
        try:
            if near:
                raw, ttl_left, failing = yield READ_FOR_NEAR
            elif spec.reads_ttl:
                raw, ttl_left, failing = yield READ_WITH_TTL_FAILING if spec.reads_failing else READ_WITH_TTL
            else:
                raw = yield READ
        except BackendUnavailable as error:
            found: Any = failed_read(events, warn, error)
            filling = True
        else:
            flight.raw = raw
            if not spec.reads_ttl:
                found = first_read(raw, spec.codec, events, warn, value_key)
                filling = isinstance(found, Miss)
            else:
                found = fresh_read(raw, ttl_left, failing, spec, events, warn, value_key, random.random)
                filling = not isinstance(found, Served)
                if not filling:
                    if found.refresh is not None:
                        ctx = new_context(value_key, spec, events, warn)
                        flow = refresh(ctx, found.refresh, found.life_left)
                        yield StartRefresh(flow, ctx, found.early)
                    flight.stale = found.stale
                    found = found.value
        if filling:
            refuse_recursion(value_key)
            ctx = new_context(value_key, spec, events, warn)
            found = yield Drive(fill(ctx, found), ctx, flight)
    except BaseException as error:
        flights.finish(value_key, flight, error=error)
        raise
    flights.finish(value_key, flight, value=found)
    if flight.stale:
        yield REPORT_STALE
    return found
