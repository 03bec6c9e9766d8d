"""Background refreshes (stale-while-revalidate, early refresh) and verifications of
sampled hits (``_core.verify``), and telling a caller its value was stale.

A refresh runs beside the callers, never before them: in a worker thread for blocking
loaders (``Refresher``), in a task on the caller's event loop for async ones
(``AsyncRefresher``, one per loop). Both are bounded the same way: one refresh per key at a time in a
process (per loop), and at most ``limit`` at once. A refresh beyond the limit is skipped
and counted (``refreshes_skipped``), never queued: the next hit on the key asks again.
Across processes, the lease collapses them into one (``_core.flow.refresh``).

A refresh runs in a context of its own: it is not the caller's call, so it neither
reports staleness to the caller (``report_stale``) nor inherits the caller's loading keys
(a refresh of a key whose loader the caller is running is not a recursion).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .._fork import reset_after_fork
from .observe import Events, RateLimitedLog
from .tracing import abackground, background


class Refresher:
    """The background refreshes of one layer's blocking loaders, run by up to ``limit``
    worker threads that stay for ``idle_timeout`` seconds after their last refresh. Once
    they are started, a caller only hands its refresh over, and does not wait for a thread
    to start (which, with many threads holding the GIL, costs a caller milliseconds)."""

    def __init__(
        self,
        limit: int,
        events: Events,
        warn: RateLimitedLog,
        idle_timeout: float = 30.0,
        skipped: str | None = "refreshes_skipped",
    ) -> None:
        self._limit = limit
        self._events = events
        self._warn = warn
        self._idle_timeout = idle_timeout
        self._skipped = skipped  # what a job beyond the limit counts (None: its caller counts it)
        self._reset()
        reset_after_fork(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._work_ready = threading.Condition(self._lock)
        self._keys: dict[str, object] = {}  # keys whose refresh is queued or running here -> its job
        self._queue: deque[tuple[str, Callable[[], object]]] = deque()
        self._workers: set[threading.Thread] = set()  # started and not exited
        self._idle = 0  # of those, waiting for work
        self._resting = 0  # of those, running a job that gave its place back (``release``)
        self._current = threading.local()  # a worker's job: (key, job, released)
        self._closed = False

    def after_fork_in_child(self) -> None:
        """The parent's workers and their refreshes are not in this process."""
        self._reset()

    def busy(self, key: str) -> bool:
        """Whether ``key`` is being refreshed here: a caller need not make a refresh that
        ``start`` would skip. (A read without the lock: ``start`` reads again under it.)"""
        return key in self._keys

    def start(self, key: str, work: Callable[[], object]) -> bool:
        """Hand ``work`` to a worker and return True, unless ``key`` is already being
        refreshed here or ``limit`` refreshes are under way (skipped, and counted)."""
        with self._lock:
            if key in self._keys or self._closed:
                return False
            if len(self._keys) >= self._limit:
                if self._skipped is not None:
                    self._events.incr(self._skipped)
                return False
            job = background(work)  # under a trace of its own, if this call is traced
            self._keys[key] = job
            self._queue.append((key, job))
            if self._idle >= len(self._queue) or len(self._workers) - self._resting >= self._limit:
                self._work_ready.notify()  # an idle worker, or the next to finish, takes it
                return True
            worker = threading.Thread(target=self._serve, name="stampede-refresh", daemon=True)
            self._workers.add(worker)
        try:
            contextvars.Context().run(worker.start)
        except RuntimeError:  # the interpreter cannot start a thread (at its limit, or exiting)
            with self._lock:
                self._workers.discard(worker)
                if (key, job) in self._queue:
                    self._queue.remove((key, job))
                    self._keys.pop(key, None)
                    if self._skipped is not None:
                        self._events.incr(self._skipped)
                    return False
        return True

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    woken = False
                    if not self._closed:
                        self._idle += 1
                        woken = self._work_ready.wait(self._idle_timeout)
                        self._idle -= 1
                    if self._closed or (not woken and not self._queue):
                        self._workers.discard(threading.current_thread())
                        return
                key, work = self._queue.popleft()
            self._current.job = [key, work, False]
            try:
                work()
            except Exception as error:
                warn_refresh_raised(self._warn, key, error)
            finally:
                with self._lock:
                    if self._keys.get(key) is work:
                        del self._keys[key]
                    if self._current.job[2]:
                        self._resting -= 1
                self._current.job = None

    def release(self) -> None:
        """Called by a job: give its place among the ``limit`` back while it goes on (a
        verification waiting ``verify_grace``, which asks nothing of the database: the
        limit bounds the load on it, and a mismatch must not hold a place longer than a
        match does, or the hits sampled meanwhile would be skipped mostly among matches)."""
        job = getattr(self._current, "job", None)
        if job is None or job[2]:
            return
        with self._lock:
            key, work, _ = job
            if self._keys.get(key) is work:
                del self._keys[key]
            job[2] = True
            self._resting += 1

    def close(self, timeout: float) -> None:
        """Start no more refreshes, let idle workers leave now, and wait up to ``timeout``
        seconds for those under way to end (so that none writes through a connection
        opened after the layer closed its own). A refresh still running then is left to
        end by itself. Queued ones are dropped."""
        with self._lock:
            self._closed = True
            for key, _ in self._queue:
                self._keys.pop(key, None)
            self._queue.clear()
            self._work_ready.notify_all()
            threads = list(self._workers)
        deadline = time.monotonic() + timeout
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def running(self) -> int:
        """Refreshes queued or running in this process and holding a place (``release``
        gives one back)."""
        with self._lock:
            return len(self._keys)


class AsyncRefresher:
    """The background refreshes of the async loaders of one event loop: a task each,
    bounded as ``Refresher``'s are. Cancelled when the loop's state closes (a cancelled
    refresh releases its lease as any cancelled load does)."""

    def __init__(
        self, limit: int, events: Events, warn: RateLimitedLog, skipped: str | None = "refreshes_skipped"
    ) -> None:
        self._limit = limit
        self._events = events
        self._warn = warn
        self._skipped = skipped
        self._tasks: dict[str, asyncio.Task[None]] = {}  # per key (or batch), queued or running
        self._resting: set[asyncio.Task[None]] = set()  # running, their places given back (``release``)
        self._closed = False

    def busy(self, key: str) -> bool:
        """Whether ``key`` is being refreshed on this loop."""
        return key in self._tasks

    def start(self, key: str, work: Callable[[], Awaitable[object]]) -> bool:
        """Start ``work`` in a task and return True, unless ``key`` is already being
        refreshed on this loop or ``limit`` refreshes are under way (skipped, and counted)."""
        if key in self._tasks or self._closed:
            return False
        if len(self._tasks) >= self._limit:
            if self._skipped is not None:
                self._events.incr(self._skipped)
            return False
        job = abackground(self._serve(key, work))  # under a trace of its own, if this call is traced
        self._tasks[key] = contextvars.Context().run(asyncio.get_running_loop().create_task, job)
        return True

    async def _serve(self, key: str, work: Callable[[], Awaitable[object]]) -> None:
        try:
            await work()
        except Exception as error:
            warn_refresh_raised(self._warn, key, error)
        finally:
            task = asyncio.current_task()
            if self._tasks.get(key) is task:
                del self._tasks[key]
            self._resting.discard(task)

    def running(self) -> int:
        """Refreshes holding a place on this loop (``release`` gives one back)."""
        return len(self._tasks)

    def release(self) -> None:
        """``Refresher.release``: the calling task's place among the ``limit`` is given
        back while it goes on (it is still cancelled when the loop's state closes)."""
        task = asyncio.current_task()
        for key, running in self._tasks.items():
            if running is task:
                del self._tasks[key]
                self._resting.add(task)
                return

    async def aclose(self) -> None:
        """Start no more refreshes, cancel those under way, and wait until they end."""
        self._closed = True
        tasks = [*self._tasks.values(), *self._resting]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class SharedVerdicts:
    """The verifications under way in a process (per event loop), one per key, and how many
    sampled hits each stands for. A hit sampled while its key's verification runs, and
    served the same envelope, shares that verdict instead of being dropped: a key whose
    verification takes long (a mismatch waits ``verify_grace``) is not sampled less than
    the others, so the counts are a fair sample of hits (``_core.verify``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._under_way: dict[str, list[Any]] = {}  # key -> [the envelope verified, hits it stands for]
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._under_way = {}

    def join(self, key: str, raw: bytes) -> bool | None:
        """True: no verification of ``key`` is under way, and the caller starts one (and
        ends it with ``done``). False: one of the same envelope is, and this hit shares
        its verdict. None: one of another envelope is: this hit is skipped."""
        with self._lock:
            under_way = self._under_way.get(key)
            if under_way is None:
                self._under_way[key] = [raw, 1]
                return True
            if under_way[0] != raw:
                return None
            under_way[1] += 1
            return False

    def done(self, key: str) -> int:
        """End ``key``'s verification: the hits its verdict counts for."""
        with self._lock:
            under_way = self._under_way.pop(key, None)
        return 0 if under_way is None else int(under_way[1])


def warn_refresh_raised(warn: RateLimitedLog, key: str, error: Exception) -> None:
    """A refresh raised (a serializer's error, say): it has no caller to raise to, so it is
    logged, at most every few seconds, blocking or asyncio alike."""
    warn.warning(
        "stampede: the background refresh of %r raised %s: %s",
        key,
        type(error).__name__,
        error,
        key=key,
        outcome="refresh_error",
    )


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
