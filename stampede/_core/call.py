"""One call's decisions around the flights of its key (sans-IO): how long a joiner may
wait, what it does with what it waited for, and what the leader's first read means.

The drivers (``_drivers.runner``, ``_drivers.arunner``) keep only the I/O: joining a table,
waiting on an event or on a future, reading the store, driving a flow, starting a
refresh. These are plain functions and one small object, not a generator of effects. A
hit passes through ``read_found`` and nothing else here, so it pays one function call.
(A generator per call was tried: it cost every warm hit about 28% more instructions, and
the objects a thousand waiting tasks kept brought a full garbage collection into their
round.)

A caller's life around a flight::

    join the key's flight
      |-- none in progress: lead. Read (``read_found``): a value, or a miss to fill
      |-- one in progress: wait for it, at most until the deadline (``Joiner.joins``)
            |-- the wait ran out: go on alone (``Outcome.TIMED_OUT``)
            |-- its value may predate an invalidation, or its leader was
            |   interrupted: join again, early for every flight (``Outcome.START_OVER``)
            |-- otherwise: its value, or its Exception raised (``Joiner.outcome``)
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Protocol

from . import world
from .codec import NOT_A_VALUE
from .flight import Flight, refuse_recursion, take_shared
from .flow import FailedRead, LoaderSpec, Miss, WarningLog, fresh_read, past_the_hit
from .freshness import Served, Stale
from .observer import Reporter, Wait


class JoinReporter(Reporter, Protocol):
    """A ``Reporter`` that also makes a caller's wait, reported begun."""

    def waiting(self) -> Wait: ...


class Outcome(enum.Enum):
    """What a joiner does instead of returning the value it waited for."""

    START_OVER = "start over"  # join the key's flight again: the caller may lead this time
    TIMED_OUT = "timed out"  # wait_timeout passed: the caller goes on alone (``flow.after_wait_timeout``)


class Joiner:
    """One caller's waits for the flights of its key, across start-overs. Made when the
    caller first finds a flight in progress, so a hit makes none.

    Invariants:

    * ``deadline`` is set once, at the first join. Starting over does not extend it, so a
      caller's wait is bounded by one ``wait_timeout`` however often it starts over.
    * ``wait`` is reported begun once (by ``Reporter.waiting``) and ended once, by
      whichever way out comes first (``Wait.end`` after the first does nothing).
    * ``early`` turns True at the first start-over and stays so: the flight the caller
      first met has left the table, so every flight it meets afterwards began after it
      did (see ``_core.flight``).
    """

    __slots__ = ("_clock", "_events", "_joined_at", "deadline", "early", "spec", "wait")

    def __init__(
        self, key: str, spec: LoaderSpec, events: JoinReporter, clock: Callable[[], float] | None = None
    ) -> None:
        # Once, before the wait is reported begun: a recursion never waits. Whether this
        # context runs the key's loader does not change while the call waits.
        refuse_recursion(key)
        self.spec = spec
        self._events = events
        self._clock = clock = world.monotonic if clock is None else clock
        self._joined_at: int | None = None
        self.deadline = clock() + spec.settings.wait_timeout
        self.wait = events.waiting()
        self.early = False

    def joins(self, flight: Flight) -> float:
        """The caller is about to wait for ``flight``: the seconds it may wait."""
        self._joined_at = None if self.early else flight.sent
        return max(0.0, self.deadline - self._clock())

    @property
    def joined_first(self) -> float:
        """When the caller first joined a flight (monotonic): after its call began."""
        return self.deadline - self.spec.settings.wait_timeout

    def interrupted(self) -> None:
        """The wait itself was interrupted (a cancelled task, a KeyboardInterrupt)."""
        self.wait.end("error")

    def outcome(self, flight: Flight, joined: bool) -> Any:
        """After waiting for ``flight`` (``joined``: it finished in time): an ``Outcome``,
        or the leader's value to return, or the leader's Exception raised."""
        if not joined:
            self.wait.end("timeout")
            return Outcome.TIMED_OUT
        if flight.starts_over(self._joined_at):
            self.early = True
            return Outcome.START_OVER
        value = take_shared(flight, self.spec, self.wait, self._events)
        if value is NOT_A_VALUE:
            self.early = True
            return Outcome.START_OVER
        return value

    def leads(self) -> None:
        """After starting over, the caller found no flight in progress and leads: what it
        waited for predated an invalidation, so it reads again itself."""
        self.wait.end("retry")


def read_found(
    flight: Flight,
    spec: LoaderSpec,
    raw: bytes | None,
    ttl_left: float,
    failing: bool,
    events: Reporter,
    warn: WarningLog,
    key: str,
    random: Callable[[], float],
) -> Any:
    """What the leader's first read means (``flow.first_read``'s, or ``flow.fresh_read``
    for a loader with freshness settings, whose read also returned ``ttl_left`` and
    ``failing``). One of:

    * the value to return, as it was read (its type is not in ``DECIDED``);
    * a ``Served`` value, to return once its refresh (if any) is started;
    * a ``Miss`` or a ``Stale`` value, which ``flow.fill`` starts from (``MISSES``).

    The flight keeps the bytes read, and whether its value is stale."""
    flight.raw = raw
    if not spec.reads_ttl:
        if raw is not None:  # a hit, as first_read decides it, here: one frame less on the hot path
            value = spec.codec.decode_hit(raw)
            if value is not NOT_A_VALUE:
                events.incr("hits")
                return value
        return past_the_hit(raw, spec.codec, events, warn, key)  # the null sentinel, a corrupt value, a miss
    found = fresh_read(raw, ttl_left, failing, spec, events, warn, key, random)
    if isinstance(found, Served):
        flight.stale = found.stale
    return found


MISSES = (Miss, Stale, FailedRead)  # what sends the leader down the miss path (``flow.fill``)
# What is not the value itself. A hit looks its type up here (exact types: none has
# subclasses), which costs less than an isinstance over four classes, one an Enum.
DECIDED = frozenset((Served, *MISSES))
