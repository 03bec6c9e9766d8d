"""Background refreshes (stale-while-revalidate, early refresh), and telling a caller its
value was stale.

A refresh runs beside the callers, never before them: in a thread of its own for
blocking loaders (``Refresher``), in a task on the caller's event loop for async ones
(``_drivers.aio``). Both are bounded the same way: one refresh per key at a time in a
process (per loop), and at most ``limit`` at once; a refresh beyond the limit is skipped
and counted (``refreshes_skipped``), never queued: the next hit on the key asks again.
Across processes, the lease collapses them into one (``_core.flow.refresh``).

A refresh runs in a context of its own: it is not the caller's call, so it neither
reports staleness to the caller (``report_stale``) nor inherits the caller's loading keys
(a refresh of a key whose loader the caller is running is not a recursion).
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .._fork import reset_after_fork
from .observe import RateLimitedLog, Stats


class Refresher:
    """The background refreshes of one layer's blocking loaders."""

    def __init__(self, limit: int, stats: Stats, warn: RateLimitedLog) -> None:
        self._limit = limit
        self._stats = stats
        self._warn = warn
        self._lock = threading.Lock()
        self._running: set[str] = set()  # keys whose refresh runs in this process
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        """The parent's refresh threads are not in this process."""
        self._lock = threading.Lock()
        self._running = set()

    def start(self, key: str, work: Callable[[], None]) -> bool:
        """Run ``work`` in a thread of its own and return True, unless ``key`` is already
        being refreshed here or ``limit`` refreshes run (skipped, and counted)."""
        with self._lock:
            if key in self._running:
                return False
            if len(self._running) >= self._limit:
                self._stats.incr("refreshes_skipped")
                return False
            self._running.add(key)
        thread = threading.Thread(target=self._run, args=(key, work), name="stampede-refresh", daemon=True)
        try:
            contextvars.Context().run(thread.start)
        except RuntimeError:  # the interpreter cannot start a thread (at its limit, or exiting)
            self._finished(key)
            self._stats.incr("refreshes_skipped")
            return False
        return True

    def _run(self, key: str, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as error:  # a serializer's error, say: a refresh has no caller to raise to
            self._warn.warning("stampede: the background refresh of %r raised %s: %s", key, type(error).__name__, error)
        finally:
            self._finished(key)

    def _finished(self, key: str) -> None:
        with self._lock:
            self._running.discard(key)

    def running(self) -> int:
        with self._lock:
            return len(self._running)


@dataclass
class Report:
    """What ``fetch()`` learns of its call: whether the value returned was stale."""

    stale: bool = False


_report: contextvars.ContextVar[Report | None] = contextvars.ContextVar("stampede_report", default=None)


def report_stale() -> None:
    """The value about to be returned to this context's caller is stale."""
    report = _report.get()
    if report is not None:
        report.stale = True


@contextmanager
def reporting() -> Iterator[Report]:
    """Collect what the calls made in this block report (``fetch()`` makes one call)."""
    report = Report()
    token = _report.set(report)
    try:
        yield report
    finally:
        _report.reset(token)
