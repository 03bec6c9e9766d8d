"""Counters of what a layer did, and a warning that does not flood the log."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

COUNTERS = (
    "hits",  # a read found a value
    "null_hits",  # a read found the null sentinel: the loader had returned None
    "misses",  # a read found nothing usable
    "loads",  # the loader was called
    "collapsed",  # a caller shared another caller's read or load in this process instead of its own
    "lock_waits",  # a caller found the distributed lock held by another process and waited
    "takeovers",  # a waiter took the lock after the holder's lease ran out
    "wait_timeouts",  # a wait exceeded wait_timeout
    "redis_errors",  # Redis failed to answer a command
    "loader_errors",  # the loader raised
    "stale_writes_prevented",  # a load finished after its lease was lost; its value was not written
    "evicted_leases",  # of those, a lease the server dropped within its term with no invalidation
    "corrupt_values",  # bytes at a key were not a readable envelope; treated as a miss
    "stale_hits",  # a read returned a value past its ttl at once, within stale_while_revalidate
    "stale_on_error",  # a value past its ttl was returned instead of the loader's error (stale_if_error)
    "refreshes",  # a background refresh took the lease and loaded
    "early_refreshes",  # a hit started a background refresh before ttl (early_refresh)
    "refresh_errors",  # a background refresh's loader raised; its stale value stays
    "refreshes_skipped",  # a background refresh was not started: the limit of refreshes at once was reached
    "near_hits",  # a call was served from the near cache, with no I/O
    "near_fills",  # a value read from Redis was copied into the near cache
    "near_invalidations",  # a near-cache copy was dropped because its key changed or was invalidated
    "near_flushes",  # every near-cache copy was dropped: the stream (re)connected, or the database was flushed
    "near_lease_lapses",  # the near cache's lease ran out or was revoked: calls read Redis until it is renewed
)


class Stats:
    """Thread-safe counters; ``snapshot()`` is what ``Stampede.stats()`` returns."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)

    def incr(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def add(self, name: str, count: int) -> None:
        with self._lock:
            self._counts[name] += count

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class RateLimitedLog:
    """Logs each kind of warning at most once per ``interval`` seconds, counting what it
    held back. The kind is the message's format string, so a flood of one kind (say,
    unreadable values) never hides another (a wait that timed out)."""

    def __init__(
        self, log: logging.Logger, interval: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = log
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}  # format string -> when that kind may be logged again
        self._held_back: dict[str, int] = {}  # format string -> warnings held back since

    def warning(self, message: str, *args: object) -> None:
        now = self._clock()
        with self._lock:
            if now < self._next.get(message, 0.0):
                self._held_back[message] = self._held_back.get(message, 0) + 1
                return
            held_back = self._held_back.pop(message, 0)
            self._next[message] = now + self._interval
        if held_back:
            message += " (%d similar warnings suppressed)"
            args = (*args, held_back)
        self._log.warning(message, *args)
