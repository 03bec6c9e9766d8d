"""In-process singleflight: of all callers asking for one key, one leads and the rest wait.

The tables of open flights, one per layer for threads and one per event loop. What a
flight is and what its joiners share is ``_core.flight``.

Invariants of ``FlightTable``, all under its lock: a key maps to at most one open flight.
a flight's ``done`` event exists once somebody joined it (most flights are hits nobody
joins, and an Event costs more than the rest of a hit in memory). ``finish`` writes
``value`` and ``error`` before it sets ``done``, and joiners read them only after.
``forget`` detaches a key's flight (an invalidation): its leader still finishes and wakes
those who joined, but later callers start a new flight instead of joining a stale one.

``AsyncFlightTable`` keeps the same invariants for the tasks of one event loop without a
lock (one thread). Each joiner waits on a future of its own, so a cancelled joiner
cancels nobody else.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from .._core.flight import Flight
from .._fork import reset_after_fork
from .._futures import settle


class FlightTable:
    """The flights of the blocking callers (threads) of one layer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[str, Flight] = {}
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        """The parent's leaders are not in this process: nobody here waits for them."""
        self._lock = threading.Lock()
        self._flights = {}

    def join(self, key: str) -> tuple[Flight, bool]:
        """The open flight for ``key``, and True if the caller leads it (the flight was
        just opened). A joiner then waits: ``wait``, or ``waiter`` for a wait begun now."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is None:
                self._flights[key] = flight = Flight()
                return flight, True
            if flight.done is None:
                flight.done = threading.Event()
            return flight, False

    @staticmethod
    def wait(flight: Flight, timeout: float) -> bool:
        """Wait for the leader of a flight joined: True once it finishes, False after
        ``timeout`` seconds (``math.inf``: no bound)."""
        done: threading.Event = flight.done
        return done.wait(timeout if timeout < math.inf else None)

    @staticmethod
    def waiter(flight: Flight, timeout: float) -> Waiter:
        """A wait of a flight joined, bounded from now, to be waited for later (a many-key
        call joins its flights before it leads its own)."""
        return Waiter(flight.done, time.monotonic() + timeout)

    def finish(self, key: str, flight: Flight, value: Any = None, error: BaseException | None = None) -> None:
        """Record the leader's outcome and wake everyone who joined."""
        flight.value, flight.error = value, error
        with self._lock:
            if self._flights.get(key) is flight:
                del self._flights[key]
            done = flight.done
        if done is not None:
            done.set()

    def forget(self, key: str) -> None:
        with self._lock:
            self._flights.pop(key, None)


@dataclass(slots=True)
class Waiter:
    """A blocking joiner's wait, begun at ``FlightTable.waiter``."""

    done: threading.Event
    deadline: float  # monotonic

    def wait(self) -> bool:
        """True once the leader finishes, False at the deadline."""
        return self.done.wait(max(0.0, self.deadline - time.monotonic()))


AsyncWaiter = asyncio.Future[bool]  # an asyncio joiner's wait: awaited


class AsyncFlightTable:
    """The flights of the tasks of one event loop."""

    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}

    def join(self, key: str) -> tuple[Flight, bool]:
        """The open flight for ``key``, and True if the caller leads it."""
        flight = self._flights.get(key)
        if flight is None:
            self._flights[key] = flight = Flight()
            return flight, True
        return flight, False

    def wait(self, flight: Flight, timeout: float) -> AsyncWaiter:
        """A future of the caller's own: True once the leader finishes, False after
        ``timeout``. One timer per flight serves all its joiners (a thousand joiners
        must not cost a thousand timers). Made at once, awaited now or later: ``waiter``
        is the same."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        deadline = loop.time() + timeout
        if flight.done is None:
            flight.done, flight.deadlines = [], []
        flight.done.append(waiter)
        flight.deadlines.append(deadline)
        if flight.timer is None or deadline < flight.timer.when():
            if flight.timer is not None:
                flight.timer.cancel()
            flight.timer = loop.call_at(deadline, self._expire, flight, loop)
        return waiter

    waiter = wait

    def finish(self, key: str, flight: Flight, value: Any = None, error: BaseException | None = None) -> None:
        flight.value, flight.error = value, error
        if self._flights.get(key) is flight:
            del self._flights[key]
        if flight.timer is not None:
            flight.timer.cancel()
            flight.timer = None
        for waiter in flight.done or ():
            settle(waiter, True)

    @staticmethod
    def _expire(flight: Flight, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time() + EXPIRY_SLACK
        pending, deadlines = [], []
        for deadline, waiter in zip(flight.deadlines, flight.done, strict=True):
            if deadline <= now:
                settle(waiter, False)
            elif not waiter.done():
                pending.append(waiter)
                deadlines.append(deadline)
        flight.done, flight.deadlines = pending, deadlines
        soonest = min(deadlines, default=None)
        flight.timer = None if soonest is None else loop.call_at(soonest, AsyncFlightTable._expire, flight, loop)

    def forget(self, key: str) -> None:
        self._flights.pop(key, None)  # one dict operation: safe from another thread too


EXPIRY_SLACK = 0.001  # a loop may run a timer up to its clock resolution early
