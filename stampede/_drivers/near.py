"""The near cache: copies of fresh values in this process, served with no I/O while the
lease on the invalidation stream holds (see ``_core.near`` for the agreement across
processes, ``_backends.redis.tracking`` for the stream).

A hit is a clock read, a dictionary lookup, a freshness check and, by default, a decode
of the stored envelope: each caller gets an object of its own, so one that mutates what
it was given changes nothing for the next. ``near_cache="shared"`` decodes once at fill
and hands every caller the same object (faster, for values nobody mutates).

The fill race: a read's reply and the invalidation of that key travel on different
connections, so a reply may carry a value that was invalidated while it was on its way.
A read therefore begins with a ``Ticket``. An invalidation of the key (or a flush)
spoils every ticket of it, and a reply fills only through an unspoiled ticket.

Only fresh values are copied, for no longer than their freshness left (the store's TTL,
read with the value, with ``early_refresh``, less: see ``_copy_of``) and ``near_ttl``.
Memory is bounded by entries and by bytes (of the envelopes). The oldest fill goes
first, so a hit takes no lock.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .._core import world
from .._core.codec import NOT_A_VALUE, Codec, Kind
from .._core.flow import LoaderSpec
from .._fork import reset_after_fork
from .observe import Events

ENTRY_OVERHEAD = 200
"""Bytes counted per copy on top of its envelope (the entry, its key, the dict slot)."""

EARLY_MARGIN = 4.0
"""With ``early_refresh``, copies end this many XFetch deltas before their ttl (XFetch
refreshes earlier than that with probability e**-4, under 2%)."""


class _Missing(enum.Enum):
    MISSING = "missing"


MISSING = _Missing.MISSING
"""What ``NearCache.get`` returns when the call must read Redis."""


@dataclass(slots=True)
class _Copy:
    raw: bytes
    value: Any  # decoded at fill, for "shared". None otherwise (and for the null sentinel)
    codec: Codec  # what decoded ``value``: a loader of another codec decodes ``raw`` itself
    null: bool
    fresh_until: float
    size: int


class Ticket:
    """One read's right to fill, spoiled by an invalidation of its key that arrives first."""

    __slots__ = ("key", "spoiled", "started")

    def __init__(self, key: str, started: float) -> None:
        self.key = key
        self.started = started  # monotonic, before the read was sent
        self.spoiled = False


class NearCache:
    """A layer's near cache, shared by its blocking and asyncio callers (the tracker's
    ``NearCopies``). ``start`` starts the tracker. It is called by the first lookup."""

    def __init__(self, max_entries: int, max_bytes: int, events: Events, start: Callable[[], None]) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._events = events
        self._start = start
        self._started = False
        self.lease_until = 0.0  # read by lookups without the lock: one float
        self._copies: dict[str, _Copy] = {}
        self._bytes = 0
        self._reading: dict[str, list[Ticket]] = {}
        self._lock = threading.Lock()
        reset_after_fork(self)

    # --- the hit path ----------------------------------------------------------------

    def get(self, key: str, codec: Codec, shared: bool) -> Any:
        """The value of ``key``'s fresh copy, or ``MISSING``."""
        now = world.monotonic()
        if now >= self.lease_until:
            if not self._started:
                self._started = True
                self._start()
            return MISSING
        copy = self._copies.get(key)
        if copy is None or now >= copy.fresh_until:
            return MISSING
        if copy.null:
            value = None
        elif shared and copy.codec is codec:
            value = copy.value
        else:
            value = codec.decode_hit(copy.raw)
            if value is NOT_A_VALUE:  # another loader's serializer under the same key
                return MISSING
        self._events.incr("near_hits")
        return value

    def raw(self, key: str) -> bytes | None:
        """The envelope of ``key``'s copy (expanded), if there is one: what a near hit
        served, for its verification (``_core.verify``)."""
        copy = self._copies.get(key)
        return None if copy is None else copy.raw

    # --- fills -------------------------------------------------------------------------

    def begin(self, key: str) -> Ticket:
        """Call before sending the read whose reply may fill ``key``."""
        ticket = Ticket(key, world.monotonic())
        with self._lock:
            self._reading.setdefault(key, []).append(ticket)
        return ticket

    def fill(self, ticket: Ticket, raw: bytes | None, ttl_left: float, spec: LoaderSpec) -> None:
        """End ``ticket``'s read: copy ``raw`` for ``spec``'s loader if it is a fresh value
        (or the null sentinel) and no invalidation of its key came in since the read began."""
        copy = None if raw is None else _copy_of(raw, ttl_left, ticket.started, spec)
        with self._lock:
            self._end(ticket)
            if copy is None or ticket.spoiled:
                return
            self._store(ticket.key, copy)
        self._events.incr("near_fills")

    def cancel(self, ticket: Ticket) -> None:
        """End ``ticket``'s read without a fill (it failed)."""
        with self._lock:
            self._end(ticket)

    def _end(self, ticket: Ticket) -> None:
        tickets = self._reading.get(ticket.key)
        if tickets is not None and ticket in tickets:
            tickets.remove(ticket)
            if not tickets:
                del self._reading[ticket.key]

    def _store(self, key: str, copy: _Copy) -> None:
        old = self._copies.pop(key, None)
        if old is not None:
            self._bytes -= old.size
        if copy.size > self.max_bytes:
            return
        self._copies[key] = copy
        self._bytes += copy.size
        while len(self._copies) > self.max_entries or self._bytes > self.max_bytes:
            oldest = next(iter(self._copies))
            self._bytes -= self._copies.pop(oldest).size

    # --- what the tracker (and this process's own invalidations) say -----------------

    def drop(self, keys: Iterable[str]) -> None:
        dropped = 0
        with self._lock:
            for key in keys:
                for ticket in self._reading.pop(key, ()):
                    ticket.spoiled = True
                copy = self._copies.pop(key, None)
                if copy is not None:
                    self._bytes -= copy.size
                    dropped += 1
        if dropped:
            self._events.incr("near_invalidations", dropped)

    def flush(self) -> None:
        with self._lock:
            self._flush()
        self._events.incr("near_flushes")

    def _flush(self) -> None:
        for tickets in self._reading.values():
            for ticket in tickets:
                ticket.spoiled = True
        self._reading.clear()
        self._copies.clear()
        self._bytes = 0

    def renew(self, until: float) -> None:
        """A lease that ran out before this renewal came drops every copy first: while it
        was out this process was not waited for (``_core.near``)."""
        if 0 < self.lease_until < world.monotonic():
            self._events.incr("near_lease_lapses")
            with self._lock:
                self._flush()
        self.lease_until = until

    def revoke(self) -> None:
        if self.lease_until > world.monotonic():
            self._events.incr("near_lease_lapses")
        self.lease_until = 0.0
        with self._lock:
            self._flush()

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._started = False
        self.lease_until = 0.0
        self._flush()

    def size(self) -> tuple[int, int]:
        """(copies, bytes) held now."""
        with self._lock:
            return len(self._copies), self._bytes


def _copy_of(raw: bytes, ttl_left: float, started: float, spec: LoaderSpec) -> _Copy | None:
    """A copy of ``raw`` for as long as it stays fresh, or None if it is not a fresh value.
    With ``early_refresh`` the copy ends earlier, while XFetch is still unlikely to have
    refreshed it (``EARLY_MARGIN`` times the last load's duration times beta before its
    ttl): the reads of Redis after it are the hits that may refresh it early."""
    raw = spec.codec.expanded(raw)  # kept expanded: a hit decodes it without decompressing
    decoded = spec.codec.decode(raw)
    if decoded.kind is Kind.CORRUPT:
        return None
    fresh_left = math.inf if ttl_left < 0 else ttl_left - decoded.stale_for
    fresh_left -= decoded.load_duration * spec.settings.early_refresh * EARLY_MARGIN
    if fresh_left <= 0:
        return None
    null = decoded.kind is Kind.NULL
    value = decoded.value if spec.near_shared and not null else None
    return _Copy(
        raw, value, spec.codec, null, started + min(fresh_left, spec.settings.near_ttl), len(raw) + ENTRY_OVERHEAD
    )
