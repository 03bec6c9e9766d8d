"""The embedded store's relays of streamed loads (``StreamStore``): each run's records in
a list, kept ``linger_ms`` past the last append, and the readers waiting for more.

A reader waits on a callback of its own (a thread's event, a task's future), which an
append calls once the records are in: no reader polls, and a reader that gives up takes
its callback away.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..._futures import settle


class Relays:
    """Every relay of one embedded store. Thread-safe."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # relay -> (records, the place of its first, expires_at)
        self._relays: dict[str, tuple[list[bytes], int, float]] = {}
        self._readers: dict[str, list[Callable[[], None]]] = {}  # relay -> wake-ups of its waiting readers

    def __deepcopy__(self, memo: dict[int, Any]) -> Relays:
        """The records, not the lock nor the readers (a replica of the store: the simulator's)."""
        copied = Relays(self._clock)
        with self._lock:
            copied._relays = {
                relay: (list(records), base, expires) for relay, (records, base, expires) in self._relays.items()
            }
        return copied

    def add(self, relay: str, records: Sequence[bytes], first: int, linger_ms: int) -> None:
        now = self._clock()
        with self._lock:
            item = self._live(relay, now)
            if item is None:
                self._drop_expired(now)
                item = ([], first)  # a relay whose first records expired begins past them
            kept, base = item
            # A record whose place is taken already is not added again (Redis refuses it too).
            kept.extend(records[max(0, base + len(kept) - first) :])
            self._relays[relay] = (kept, base, now + linger_ms / 1000)
            wake = self._readers.pop(relay, [])
        for reader in wake:
            reader()

    def read(self, relay: str, after: int) -> list[bytes]:
        with self._lock:
            return self._read(relay, after)

    def wait(self, relay: str, after: int, timeout: float) -> list[bytes]:
        """``read``, waiting up to ``timeout`` seconds for a record if there is none."""
        event = threading.Event()
        with self._lock:
            records = self._read(relay, after)
            if records or timeout <= 0:
                return records
            self._readers.setdefault(relay, []).append(event.set)
        event.wait(timeout)
        return self._done_waiting(relay, after, event.set)

    async def await_records(self, relay: str, after: int, timeout: float) -> list[bytes]:
        """``wait`` for a task: the event loop goes on while it waits."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(settle, future, True)

        with self._lock:
            records = self._read(relay, after)
            if records or timeout <= 0:
                return records
            self._readers.setdefault(relay, []).append(wake)
        try:
            await asyncio.wait({future}, timeout=timeout)
        finally:
            records = self._done_waiting(relay, after, wake)
        return records

    def _done_waiting(self, relay: str, after: int, reader: Callable[[], None]) -> list[bytes]:
        with self._lock:
            readers = self._readers.get(relay)
            if readers is not None and reader in readers:
                readers.remove(reader)
                if not readers:
                    del self._readers[relay]
            return self._read(relay, after)

    def _read(self, relay: str, after: int) -> list[bytes]:
        """The records from place ``after`` on (none if the relay begins past it)."""
        item = self._live(relay, self._clock())
        if item is None or item[1] > after:
            return []
        kept, base = item
        return kept[after - base :]

    def _live(self, relay: str, now: float) -> tuple[list[bytes], int] | None:
        item = self._relays.get(relay)
        if item is None:
            return None
        if item[2] <= now:
            del self._relays[relay]
            return None
        return item[0], item[1]

    def _drop_expired(self, now: float) -> None:
        for relay in [relay for relay, item in self._relays.items() if item[2] <= now]:
            del self._relays[relay]
