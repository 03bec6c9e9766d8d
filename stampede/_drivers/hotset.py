"""Recording hot sets (``_core.hotset``): the calls a layer's loaders sampled, counted in
the process and added to the store in batches, off the callers' path.

A sampled call costs its caller a dict increment under a lock. A thread of the layer's
adds what was counted to the store every ``FLUSH_INTERVAL`` seconds, one command per
loader, and ends after ``IDLE_TIMEOUT`` seconds with nothing to add (the next sample
starts it again). A store that fails loses that batch, counted (``hot_set_errors``): a
hot set is a sample, and a caller never waits for it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextvars import ContextVar

from .._core.hotset import Call, Countdown, HotSet, encode_call
from .._core.store import HotSetStore
from .._fork import reset_after_fork
from .observe import Events, RateLimitedLog

FLUSH_INTERVAL = 1.0
IDLE_TIMEOUT = 30.0


class HotSetRecorder:
    """The sampled calls of one layer's loaders, on their way to the store."""

    def __init__(
        self,
        store: Callable[[], HotSetStore],
        events: Events,
        warn: RateLimitedLog,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._events = events
        self._warn = warn
        self._wall_clock = wall_clock
        self._reset()
        reset_after_fork(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one flush at a time: one returns after any under way
        self._pending: dict[HotSet, Counter[bytes]] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def after_fork_in_child(self) -> None:
        """The parent's thread and its counts are not in this process."""
        self._reset()

    def record(self, hot: HotSet, members: Iterable[bytes]) -> None:
        """Count the calls one sample of the loader whose hot set is ``hot`` made (a
        many-key call's ids are a call each)."""
        with self._lock:
            if self._closed:
                return
            counts = self._pending.get(hot)
            if counts is None:
                counts = self._pending[hot] = Counter()
            counts.update(members)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stampede-hot-set", daemon=True)
                self._thread.start()

    def flush(self) -> int:
        """Add what was counted to the store now. Returns the calls added. Once it
        returns, every call counted before it is in the store: a flush the layer's
        thread had under way (its counts taken, not yet written) has ended too."""
        with self._flushing:
            with self._lock:
                pending, self._pending = self._pending, {}
            return self._add(pending)

    def _add(self, pending: dict[HotSet, Counter[bytes]]) -> int:
        added = 0
        moment = self._wall_clock()
        for hot, counts in pending.items():
            try:
                self._store().note_hot(hot.key(moment), counts, hot.limit, hot.ttl_ms)
            except Exception as error:  # BackendUnavailable, or a store's own: never the thread's end
                self._events.incr("hot_set_errors")
                self._warn.warning(
                    "stampede: recording a hot set failed (%s: %s); that sample is lost", type(error).__name__, error
                )
                continue
            added += sum(counts.values())
        return added

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            self._wake.wait(FLUSH_INTERVAL)
            with self._lock:
                closed, busy = self._closed, bool(self._pending)
                if not busy and (closed or time.monotonic() - idle_since > IDLE_TIMEOUT):
                    self._thread = None
                    return
            if busy:
                self.flush()
                idle_since = time.monotonic()

    def close(self, timeout: float) -> None:
        """Add what is left, then stop the thread (within ``timeout`` seconds)."""
        with self._lock:
            self._closed = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout)


WARMING: ContextVar[bool] = ContextVar("stampede_warming", default=False)
"""Set while ``Stampede.warm`` calls a loader: its calls are not sampled again."""


class HotSampler:
    """A loader's sampling of its calls (``hot_sample``) into its hot set."""

    __slots__ = ("_recorder", "countdown", "hot")

    def __init__(self, hot: HotSet, rate: float, recorder: HotSetRecorder) -> None:
        self.hot = hot
        self.countdown = Countdown(rate)
        self._recorder = recorder

    def record(self, calls: Iterable[Call]) -> None:
        """The countdown ran out: record the calls this one stands for (a many-key call
        is one call of each id it asked: ``ManyKeys.one_id_calls``), and draw the next
        countdown. ``calls`` is read only if recorded: a lazy iterable costs nothing
        while warming. A call whose arguments are not plain JSON is left out."""
        self.countdown.left = self.countdown.next()
        if WARMING.get():
            return
        members = [member for args, kwargs in calls if (member := encode_call(args, kwargs)) is not None]
        if members:
            self._recorder.record(self.hot, members)
