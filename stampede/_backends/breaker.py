"""The circuit breaker: after repeated connection failures, stop asking Redis for a while.

A stalled or unreachable server costs every caller one socket timeout before the
fail-open path serves it: a second or two per request, for as long as the outage lasts.
After ``threshold`` connection failures in a row the breaker opens: for ``cooldown``
seconds every command fails at once (BackendUnavailable, "circuit open"), so callers
go straight to the ``on_backend_error`` policy. Then one caller's command is let through
as a probe. Its success closes the breaker, its failure opens it for another cool-down.
Only failures to reach the server count (connection refused or reset, timeouts): an
error reply means the server is there, and a caller that timed out waiting for a free
connection of the pool never asked it (the commands holding the connections count).

Timeline, threshold 3, cool-down 5 s:

    t=0.0  GET times out (failure 1) ... t=4.0 failure 3: open until t=9.0
    t=4.0-9.0  every command fails at once. Nobody waits on a socket
    t=9.1  a caller's GET is the probe. The others still fail at once
    t=9.1  the probe answers: closed, every command goes to Redis again

Shared by a layer's blocking store and its asyncio stores (one server, one verdict).
The closed state is read without the lock: the hit path pays one comparison. On a Redis
Cluster each primary has a breaker of its own (``NodeBreakers``): one failed primary
opens the circuit for its slots only, and the replica promoted in its place starts
closed. Through Sentinel each master address has its own, for the same reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .._errors import BackendUnavailable
from .._fork import reset_after_fork

log = logging.getLogger("stampede.backend")


class CircuitBreaker:
    """``on_change(True)`` is called when the breaker opens, ``on_change(False)`` when it
    closes again (the layer's reports: ``breaker_opened``, ``breaker_closed``)."""

    def __init__(
        self,
        threshold: int,
        cooldown: float,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.threshold = threshold  # 0: never opens
        self.cooldown = cooldown
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._failures = 0  # connection failures in a row. >= threshold while open
        self._open_until = 0.0  # no command before this time (clock)
        self._probe_until = 0.0  # a probe is out until this time. After it, another may go
        self._cause = ""  # the last failure, as its error said: what an open circuit names
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()

    def check(self, key: str) -> None:
        """Raise BackendUnavailable if no command may go to the server now."""
        if not self.threshold or self._failures < self.threshold:
            return
        now = self._clock()
        with self._lock:
            if self._failures < self.threshold:
                return  # closed meanwhile
            if now >= self._open_until and now >= self._probe_until:
                self._probe_until = now + self.cooldown  # this caller probes
                log.info("stampede: circuit half-open; probing the server")
                return
        cause = f" (the last: {self._cause})" if self._cause else ""
        raise BackendUnavailable(
            f"circuit open: the server failed {self._failures} times in a row{cause}; not asking it about "
            f"{key!r} for up to {self.cooldown} s",
            key=key,
        )

    @property
    def open(self) -> bool:
        """Whether commands are being refused (or only a probe let through) now."""
        return bool(self.threshold) and self._failures >= self.threshold

    def succeeded(self) -> None:
        if self._failures:
            with self._lock:
                closed = self._failures >= self.threshold > 0
                self._failures = 0
                self._probe_until = 0.0
            if closed:
                log.warning("stampede: the server answers again; circuit closed")
                if self._on_change is not None:
                    self._on_change(False)

    def failed(self, cause: str = "") -> None:
        """A command did not reach the server; ``cause`` says why (named while open)."""
        with self._lock:
            self._failures += 1
            if cause:
                self._cause = cause
            opened = self._failures == self.threshold > 0
            if self.threshold and self._failures >= self.threshold:
                self._open_until = self._clock() + self.cooldown
                self._probe_until = 0.0
        if opened:
            log.warning(
                "stampede: the server failed %d times in a row (the last: %s); circuit open for %s s",
                self.threshold,
                self._cause or "unknown",
                self.cooldown,
            )
            if self._on_change is not None:
                self._on_change(True)


SLOTS_REFRESH_INTERVAL = 0.5


class NodeBreakers:
    """One ``CircuitBreaker`` per server (host:port) of a Redis Cluster or of a Sentinel
    set, made when a server is first asked about. Shared by a layer's blocking and
    asyncio stores.

    A client learns that a slot or the master moved from a failed command. While a
    server's circuit is open no command goes to it, so the store asks where commands go
    instead (CLUSTER SLOTS, or the sentinels), at most every ``SLOTS_REFRESH_INTERVAL``
    (``refresh_due``): once a replica is promoted, commands go to it, and its breaker
    starts closed. The interval counts from the end of the last asking, and doubles (up to
    the cooldown) while nobody answers: with every sentinel silent, an asking costs a
    socket timeout per sentinel, which the circuit is open to spare callers."""

    def __init__(
        self,
        threshold: int,
        cooldown: float,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._threshold = threshold
        self._cooldown = cooldown
        self._clock = clock
        self._on_change = on_change
        self._breakers: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()
        self._next_refresh = 0.0
        self._refresh_interval = SLOTS_REFRESH_INTERVAL  # doubled while askings go unanswered
        reset_after_fork(self)

    def refresh_due(self) -> bool:
        """True for one caller per ``SLOTS_REFRESH_INTERVAL``."""
        now = self._clock()
        if now < self._next_refresh:
            return False
        with self._lock:
            if now < self._next_refresh:
                return False
            self._next_refresh = now + self._refresh_interval
            return True

    def refreshed(self, answered: bool) -> None:
        """The asking that ``refresh_due`` allowed has ended, answered or not."""
        with self._lock:
            if answered:
                self._refresh_interval = SLOTS_REFRESH_INTERVAL
            else:
                self._refresh_interval = min(max(self._cooldown, SLOTS_REFRESH_INTERVAL), self._refresh_interval * 2)
            self._next_refresh = self._clock() + self._refresh_interval

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()

    def of(self, node: str) -> CircuitBreaker:
        breaker = self._breakers.get(node)
        if breaker is None:
            with self._lock:
                breaker = self._breakers.setdefault(
                    node, CircuitBreaker(self._threshold, self._cooldown, on_change=self._on_change)
                )
        return breaker
