"""What a loader may return besides its value: ``Cached``, a value with its own caching
rules (sans-IO).

A loader knows things its decorator cannot: this result is empty and should live 10 s,
this one carries tags of its own, this one is a partial answer that must not be kept.
It says so by returning ``Cached(value, ttl=..., tags=..., store=...)``. Callers always
get ``value``.

How each field is kept by the flow (``_core.flow``):

* ``ttl`` replaces the loader's ``ttl`` (or ``null_ttl``, for a None value) for this
  value only. Jitter applies to it, and the stale windows follow it: they are measured
  from the end of this ttl, as from any other.
* ``tags`` join the entry's tags in the same tagged write, admitted by each tag as the
  loader's own are (``_core.tags``). The tag clock must be read before the load begins,
  and only a loader declared with ``tags=`` reads it: so value tags need ``tags=`` on the
  decorator (``tags=[]`` when every tag comes from values).
* ``store=False`` writes nothing that outlives the flight. The value goes to every caller
  of the flight: the callers in this process who joined it, and the waiters in other
  processes, in the wake-up message. Its write keeps nothing (the old value goes too) but
  is made under the lease and admitted by the entry's tags like any other, so the
  stale-set guard still holds: a load an invalidation overtook, or a tag invalidated
  during it, hands its value to nobody else. A caller who arrives after the flight ended
  misses and starts one new load, which the callers arriving with it share: nobody
  queues behind one lease after another (Varnish's hit-for-miss), and nobody is served a
  value that was not to be kept.

A load that refreshes a value (a background refresh, ``refresh()``, a miss with a stale
value in hand) can see that value (``previous()``: the value and when its load began)
and answer ``NOT_MODIFIED``: the value is kept and its freshness starts again, without
writing it (only its expiry is set again; ``Cached(NOT_MODIFIED, ttl=60)`` sets a ttl of
its own). An entry with tags is written again instead: its tags must admit it anew
(``_core.tags``).
"""

from __future__ import annotations

import contextvars
import enum
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from .codec import Codec

V = TypeVar("V")

PASS_THROUGH_MS = 0
"""The ``ttl_ms`` of a ``store=False`` value's write: 0, kept by nobody (the store deletes
the entry's value, releases the lease and hands the value to its waiters only)."""


@dataclass(frozen=True, slots=True)
class Cached(Generic[V]):
    """A loader's value with caching rules of its own. Callers get ``value``.

    ``ttl``: seconds this value is fresh (None: the loader's ``ttl``, or ``null_ttl``).
    ``tags``: tags of this value, joining the loader's (which must be declared with
    ``tags=``). ``store``: False hands the value to the callers of this load only.
    """

    value: V
    ttl: float | None = None
    tags: Sequence[str] = ()
    store: bool = True

    def __post_init__(self) -> None:
        ttl = self.ttl
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) or ttl <= 0
        ):
            raise ValueError(f"Cached ttl must be a positive number of seconds or None, got {ttl!r}")
        if isinstance(self.tags, str) or not isinstance(self.tags, (list, tuple, set, frozenset)):
            raise ValueError(f'Cached tags must be a list of tag names, e.g. ["product:7"], got {self.tags!r}')
        if not isinstance(self.store, bool):
            raise ValueError(f"Cached store must be True or False, got {self.store!r}")
        if type(self.value) is Cached:
            raise ValueError("a Cached holds a value, not another Cached: return Cached(value, ...) once")


def unwrapped(result: Any) -> tuple[Any, Cached[Any] | None]:
    """A loader's return value as ``(value, rules)``: rules None for a plain value."""
    if type(result) is Cached:
        return result.value, result
    return result, None


class Unkept(Exception):
    """Raised by a loader whose answer is its own caller's alone, and no failure: an HTTP
    response that may not be shared (``no-store``, ``private``, a ``Set-Cookie``, a
    stream), handed over as it is read. It cannot be a ``Cached(store=False)`` value,
    which goes to the waiters of other processes in the wake-up message.

    The flow treats it as an answer, not an error: the lease is released at once (the
    next caller loads for itself, Varnish's hit-for-miss), no loader error is counted,
    nothing is held, and no stale value is served in its place (``stale_if_error`` masks
    failures only, RFC 5861 section 4). It is raised to the caller, and to the callers
    of this process who joined the load, who each decide whether it is theirs."""


class _NotModified(enum.Enum):
    NOT_MODIFIED = "not modified"


NOT_MODIFIED = _NotModified.NOT_MODIFIED
"""What a loader returns to keep the value it refreshes (``previous()``): it is not written
again, its freshness starts again."""


class Previous:
    """The value a load refreshes: ``value`` (decoded when first asked for) and
    ``loaded_at``, when its own load began (seconds since the epoch, by the loading
    machine's clock): compare it with the rows' last change, as If-Modified-Since does."""

    __slots__ = ("_codec", "_decoded", "loaded_at", "raw")

    def __init__(self, raw: bytes, codec: Codec, loaded_at: float) -> None:
        self.raw = raw
        self.loaded_at = loaded_at
        self._codec = codec
        self._decoded: Any = _UNREAD

    @property
    def value(self) -> Any:
        if self._decoded is _UNREAD:
            self._decoded = self._codec.decode(self.raw).value
        return self._decoded

    def __repr__(self) -> str:
        return f"Previous(loaded_at={self.loaded_at!r})"


_UNREAD = object()
_refreshing: contextvars.ContextVar[Previous | None] = contextvars.ContextVar("stampede_previous", default=None)


def previous() -> Previous | None:
    """Inside a loader: the value its load refreshes, or None (a cold miss, or called
    elsewhere). Return ``NOT_MODIFIED`` to keep it."""
    return _refreshing.get()


@contextmanager
def refreshing(previous: Previous | None) -> Iterator[None]:
    """While a load runs: ``previous()`` answers ``previous``."""
    token = _refreshing.set(previous)
    try:
        yield
    finally:
        _refreshing.reset(token)
