"""A flight: one leader's read or load of a key in this process, and what those who joined
it share. The decisions are here. The tables that hold flights are the drivers'
(``_drivers.singleflight``), and so are the calls that join or lead one.

The leader reads the cache and, on a miss, loads. Those who join share its outcome, so
concurrent callers of one key cost one read, and on a miss one load, per process (per
event loop for asyncio callers). What a joiner does with the outcome is decided once,
in ``Flight``: it shares the leader's value or Exception, and if the leader was
interrupted (a BaseException that is not an Exception: a cancelled task, a
KeyboardInterrupt) or its value could not be written, it starts over, so that one of
the joiners leads.

A value is shared only with those who joined before the leader sent the command that
produced it (``Flight.sent``). Another process's invalidation may complete while a GET is
on the wire. A caller who arrives after that must not be handed what the GET read before:

    t=0    process B's leader sends GET k (the cache holds version 1)
    t=1    process A updates the database to version 2 and invalidates k: done
    t=2    a caller in B arrives and joins B's flight for k
    t=3    the GET's reply (version 1) arrives

The caller at t=2 began after the invalidation completed, so version 1 would be stale.
It starts over instead, and is sure to be early for every flight it meets then: its
first flight has left the table, so any flight there now began after it did. So late
callers cost one more round trip, shared, and reads stay shared: one GET of a key in
flight per process at a time, however many callers. The steps that may produce the value
are the commands to the cache and a load made without the lease (``produces_value``). A
leased load's joiners keep its value: they arrived before its write was sent, and a write
sent after an invalidation is refused (the lease is gone, ``unwritten`` sends them back).
A load without the lease (the cache unreachable) has no such guard, so those who arrive
during it wait for the next one, which they share: still one load in flight per key.
A value that came in another process's message was written some time after the leader
subscribed, so it goes to those who arrived before the subscription (``via_notice``).

A load without the lease (a caller's wait for another process's load ran past
``wait_timeout``, or the store failed) is made once per key per process at a time: the
callers that need one meanwhile share it (``fallback_key``), as long as each began before
it did (``Flight.opened_at``). A leader and its joiners time out at about the same time,
whichever first, so their process loads once, not once per caller.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from .._errors import RecursiveLoad
from .codec import NOT_A_VALUE, Kind
from .effects import Effect, Subscribe
from .flow import LoaderSpec, produces_value
from .observer import Reporter, Wait


class Flight:
    """One leader's read or load of a key, and what those who joined it share.

    No ``__init__``: a flight starts as its class attributes say, and each is written on
    the instance only when it changes, so opening one (every hit does) costs no stores."""

    done: Any = None  # threading.Event, or a list of futures (asyncio). Made by the first joiner
    value: Any = None
    error: BaseException | None = None
    timer: Any = None  # asyncio: the earliest joiner's deadline (a TimerHandle)
    deadlines: list[float]  # asyncio: each future's deadline, set with ``done`` (floats: nothing for the GC to track)
    unwritten = False  # the leader loaded a value but its write was refused or failed. Set before done
    sent = 0  # the leader's steps that may produce its value. Bumped just before each
    subscribed_at = 0  # ``sent`` when the leader subscribed to the entry's channel
    stale = False  # the value is stale (served while refreshed, or instead of an error). Set before done
    codec: Any = None  # the leader's Codec. Set when it leads
    raw: bytes | None = None  # the envelope the value was read from or written as. Set before done
    trace: Any = None  # the leader's call trace, if traced, for its joiners' links (``_drivers.tracing``)
    opened_at = 0.0  # a load without the lease (``fallback_key``): when it began (monotonic)

    def count(self, effect: Effect) -> None:
        """The leader is about to perform ``effect``: count it if it may produce the value."""
        if produces_value(effect):
            self.sent += 1
            if isinstance(effect, Subscribe):
                self.subscribed_at = self.sent

    def decided(self, unwritten: bool, via_notice: bool, served_stale: bool = False, raw: bytes | None = None) -> None:
        """The leader's flow returned its value: if its write was refused or failed, it
        goes to nobody else. If it came in a message, only to those who arrived before
        the subscription. If it is the stale value of the first read, only to those who
        arrived before that read."""
        self.unwritten = unwritten
        if not served_stale:  # a stale value served is the first read's, whose bytes are kept
            self.raw = raw
        if via_notice:
            self.sent = self.subscribed_at
        if served_stale:
            self.sent, self.stale = 1, True

    def starts_over(self, joined_at: int | None) -> bool:
        """Whether a joiner must start over instead of sharing the outcome: the leader was
        stopped by something other than an Exception (a cancelled task, a KeyboardInterrupt).
        or its value's write was refused, so the value may predate an invalidation
        elsewhere. Or the value came from a command sent before the joiner arrived
        (``joined_at`` is ``sent`` as the joiner saw it on joining, None for a caller that
        started over once, which is early for every flight it meets)."""
        if self.error is not None:
            return not isinstance(self.error, Exception)
        return self.unwritten or (joined_at is not None and joined_at >= self.sent)

    def shared(self, spec: LoaderSpec) -> Any:
        """The leader's outcome for a joiner calling ``spec``'s loader: its Exception
        raised, or its value. The leader's own object goes only to a joiner of a loader
        that decodes alike (the same codec) and whose callers may share objects. Any other
        joiner decodes the envelope afresh, so it never gets another loader's type nor an
        object another caller may mutate. ``NOT_A_VALUE`` if the envelope is not a value
        for the joiner's codec: it starts over, as it would on its own."""
        if self.error is not None:
            raise self.error
        if self.codec is spec.codec and not spec.own_copies:
            return self.value
        raw = self.raw
        if raw is None:
            return NOT_A_VALUE
        decoded = spec.codec.decode(raw)
        return NOT_A_VALUE if decoded.kind is Kind.CORRUPT else decoded.value


FALLBACK = "\x00unleased"


def fallback_key(key: str) -> str:
    """The flight-table key of the load without the lease that a process's callers of
    ``key`` share (no cache key holds a NUL)."""
    return key + FALLBACK


def shares_fallback(flight: Flight, began: float) -> bool:
    """Whether a caller that began at ``began`` (monotonic) may take the outcome of the
    load without the lease ``flight`` made: only if it began before that load did (a load
    read the database when it began, perhaps before an invalidation that returned before
    a later caller began), and its caller was not interrupted (a BaseException that is not
    an Exception goes to nobody else)."""
    if flight.error is not None and not isinstance(flight.error, Exception):
        return False
    return began < flight.opened_at


# The keys whose loader runs in this context: the thread, or the task and the tasks it
# starts (they copy the context). A call for one of them from inside its own load would
# wait for itself until wait_timeout. It is refused at once instead.
_loading: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("stampede_loading", default=frozenset())


def refuse_recursion(key: str) -> None:
    """Raise ``RecursiveLoad`` if ``key``'s loader is running in this context. Checked
    by callers who would wait (a joiner, a miss), never on a hit."""
    if key in _loading.get():
        raise RecursiveLoad(
            f"the loader of {key!r} called itself for the same key (directly or through other "
            "loaders); it would wait for its own result",
            key=key,
        )


@contextmanager
def loading(key: str) -> Iterator[None]:
    """Mark ``key``'s loader as running in this context while the block runs."""
    token = _loading.set(_loading.get() | {key})
    try:
        yield
    finally:
        _loading.reset(token)


@contextmanager
def loading_all(keys: Iterable[str]) -> Iterator[None]:
    """``loading`` for a many-key loader's call: every key it loads."""
    token = _loading.set(_loading.get().union(keys))
    try:
        yield
    finally:
        _loading.reset(token)


def take_shared(flight: Flight, spec: LoaderSpec, wait: Wait, events: Reporter) -> Any:
    """A joiner takes its leader's outcome (``Flight.shared``): counted as ``collapsed``,
    its wait reported ended with the value or with the leader's error. ``NOT_A_VALUE``
    (nothing counted, the wait still open): the joiner starts over."""
    try:
        value = flight.shared(spec)
    except BaseException:
        events.incr("collapsed")
        wait.end("error")
        raise
    if value is NOT_A_VALUE:
        return value
    events.incr("collapsed")
    wait.end("value")
    return value
