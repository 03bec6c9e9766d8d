"""In-process singleflight: of all threads asking for one key, one leads and the rest wait.

The leader reads the cache and, on a miss, loads; those who join share its outcome, so
concurrent callers of one key cost one read, and on a miss one load, per process.

Invariants, all under the table's lock: a key maps to at most one open flight; a flight's
``done`` event exists once somebody joined it (most flights are hits nobody joins, and
an Event costs more than the rest of a hit in memory); ``finish`` writes ``value`` and
``error`` before it sets ``done``, and joiners read them only after. ``forget`` detaches
a key's flight (an invalidation): its leader still finishes and wakes those who joined,
but later callers start a new flight instead of joining a stale one.
"""

from __future__ import annotations

import threading
from typing import Any


class Flight:
    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done: threading.Event | None = None  # made by the first joiner
        self.value: Any = None
        self.error: BaseException | None = None


class FlightTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[str, Flight] = {}

    def join(self, key: str) -> tuple[Flight, threading.Event | None]:
        """The open flight for ``key``, and the event to wait on; None if the caller
        leads (the flight was just opened)."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is None:
                self._flights[key] = flight = Flight()
                return flight, None
            if flight.done is None:
                flight.done = threading.Event()
            return flight, flight.done

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
