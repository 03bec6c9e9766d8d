"""In-process singleflight: of all threads asking for one key, one leads and the rest wait.

Invariants: a key maps to at most one open flight; a flight's ``value`` and ``error`` are
written once, by its leader, before ``done`` is set, and read only after. ``forget``
detaches a key's flight (an invalidation): its leader still finishes and wakes those who
joined, but later callers start a new flight instead of joining a stale one.
"""

from __future__ import annotations

import threading
from typing import Any


class Flight:
    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class FlightTable:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[str, Flight] = {}

    def join(self, key: str) -> tuple[Flight, bool]:
        """The open flight for ``key`` and whether the caller leads it (it was just opened)."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is not None:
                return flight, False
            flight = self._flights[key] = Flight()
            return flight, True

    def finish(self, key: str, flight: Flight, value: Any = None, error: BaseException | None = None) -> None:
        """Record the leader's outcome and wake everyone who joined."""
        flight.value, flight.error = value, error
        with self._lock:
            if self._flights.get(key) is flight:
                del self._flights[key]
        flight.done.set()

    def forget(self, key: str) -> None:
        with self._lock:
            self._flights.pop(key, None)
