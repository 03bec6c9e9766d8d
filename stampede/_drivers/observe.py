"""What a layer reports (``_core.observer``), counted and fanned out to its observers. And
a warning that does not flood the log."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .._core import world
from .._core.observer import COUNTERS, UNOBSERVED, BudgetObserver, Measure, Observer, Wait, log_extra
from .._errors import ConfigError
from .._fork import reset_after_fork


class Counts:
    """A layer's counters, what ``Stampede.stats()`` returns (``snapshot()``). Loads and
    waits are counted by their counters (``loads``, ``collapsed``, ``lock_waits``), not
    timed. ``Events.incr`` is the one writer: it increments ``values`` under ``lock``
    itself, so that a hit's counter costs no call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values = dict.fromkeys(COUNTERS, 0)  # written under ``lock``
        self.budgets: dict[str, list[int]] = {}  # a budget's loads queued and running now, under ``lock``
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        """A parent's thread may have held the lock at the fork (every call takes it): the
        child gets a new one, and its counts carry on from the parent's."""
        self.lock = threading.Lock()

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.values)

    def budgets_now(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {name: {"queued": queued, "running": running} for name, (queued, running) in self.budgets.items()}


class Events:
    """One layer's reports, fanned out to its ``Counts`` and to the observers added to
    it. An observer that raises is warned about (rate limited) and skipped for that
    report. The caller never sees its error. With no observer added, a report costs
    the counter's increment and one truth test."""

    def __init__(self, namespace: str, warn: RateLimitedLog) -> None:
        self.namespace = namespace
        self.counts = Counts()
        self._warn = warn
        self._observers: tuple[Observer, ...] = ()  # replaced whole, under _adding: read without a lock
        self._budget_observers: tuple[BudgetObserver, ...] = ()  # those of them with budget()
        self._budget_wait_observers: tuple[BudgetObserver, ...] = ()  # those of them with budget_waited()
        self._adding = threading.Lock()
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        self._adding = threading.Lock()  # perhaps held by a parent's thread at the fork

    def add(self, observer: Observer) -> None:
        for method in ("count", "began", "ended"):
            if not callable(getattr(observer, method, None)):
                raise ConfigError(f"an observer needs count(), began() and ended(); {observer!r} has no {method}()")
        with self._adding:
            self._add(observer)

    def _add(self, observer: Observer) -> None:
        self._observers = (*self._observers, observer)
        if callable(getattr(observer, "budget", None)):
            self._budget_observers = (*self._budget_observers, observer)  # type: ignore[arg-type]
        if callable(getattr(observer, "budget_waited", None)):
            self._budget_wait_observers = (*self._budget_wait_observers, observer)  # type: ignore[arg-type]

    def feed(self, observer: Observer) -> None:
        """Add ``observer`` unless it is added: how traces hear a layer (``_drivers.tracing``),
        once its first traced call begins."""
        if observer not in self._observers:
            with self._adding:
                if observer not in self._observers:
                    self._add(observer)

    def incr(self, name: str, n: int = 1) -> None:
        counts = self.counts
        with counts.lock:
            counts.values[name] += n
        if self._observers:
            for observer in self._observers:
                try:
                    observer.count(self.namespace, name, n)
                except Exception as error:
                    self._failed(observer, error)

    def waiting(self) -> Wait:
        """A caller's wait, reported begun (``UNOBSERVED`` while no observer is added)."""
        if not self._observers:
            return UNOBSERVED
        wait = Wait(self, world.monotonic)
        wait.begin()
        return wait

    def began(self, measure: Measure) -> None:
        for observer in self._observers:
            try:
                observer.began(self.namespace, measure)
            except Exception as error:
                self._failed(observer, error)

    def ended(self, measure: Measure, outcome: str, seconds: float) -> None:
        for observer in self._observers:
            try:
                observer.ended(self.namespace, measure, outcome, seconds)
            except Exception as error:
                self._failed(observer, error)

    def budget(self, name: str, queued: int, running: int) -> None:
        """The loads of budget ``name`` in this process waiting for a slot and holding one
        went up (or down) by ``queued`` and ``running``."""
        counts = self.counts
        with counts.lock:
            now = counts.budgets.get(name)
            if now is None:
                now = counts.budgets[name] = [0, 0]
            now[0] += queued
            now[1] += running
        for observer in self._budget_observers:
            try:
                observer.budget(self.namespace, name, queued, running)
            except Exception as error:
                self._failed(observer, error)

    def budget_waited(self, name: str, outcome: str, seconds: float) -> None:
        """A load's wait for a slot of budget ``name`` ended (``ended`` of ``budget_wait``
        tells it per namespace)."""
        for observer in self._budget_wait_observers:
            try:
                observer.budget_waited(self.namespace, name, outcome, seconds)
            except Exception as error:
                self._failed(observer, error)

    def breaker_changed(self, opened: bool) -> None:
        """A circuit breaker of the layer opened or closed (``_backends.breaker``)."""
        self.incr("breaker_opened" if opened else "breaker_closed")

    def _failed(self, observer: object, error: Exception) -> None:
        self._warn.warning(
            "stampede: observer %r raised %s: %s; its report was dropped",
            observer,
            type(error).__name__,
            error,
            outcome="observer_error",
        )


class RateLimitedLog:
    """Logs each kind of warning at most once per ``interval`` seconds, counting what it
    held back. The kind is the message's format string, so a flood of one kind (say,
    unreadable values) never hides another (a wait that timed out). Each record carries
    the structured fields of ``_core.observer.log_extra`` (namespace, key hash, outcome)."""

    def __init__(
        self,
        log: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        namespace: str = "",
    ) -> None:
        self._log = log
        self._namespace = namespace
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}  # format string -> when that kind may be logged again
        self._held_back: dict[str, int] = {}  # format string -> warnings held back since
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # perhaps held by a parent's thread at the fork

    def warning(self, message: str, *args: object, key: str = "", outcome: str = "") -> None:
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
        self._log.warning(message, *args, extra=log_extra(key, outcome, self._namespace))
