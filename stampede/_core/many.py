"""A many-key call's decisions (sans-IO): what its first read of many entries means, and
what the loader's answer for many ids is.

A many-key call is one call per entry, run together (see ``_core.batch`` for the misses):

    near cache        answers what it holds
    join flights      an entry whose flight is in progress in this process is that
                      flight's (waited for after this call's own entries, as one key)
    read              the entries this call leads, in one round trip (``read_many``)
    fill together     the misses' flows driven as one (``batch.together``): every lease
                      taken in one round trip, the loader called once with the ids this
                      caller leads, every value written in one round trip
    refresh together  stale entries' refreshes in one background batch

Every entry keeps its own key, lease, flight and wake-up, so a many-key call and a
single-key call of the same entry share them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import BackendUnavailable
from .call import DECIDED, read_found
from .codec import NOT_A_VALUE
from .flight import Flight
from .flow import FailedRead, LoaderSpec, Miss, WarningLog, failed_read
from .freshness import Served
from .observer import Reporter


class Found:
    """What a many-key call's first read found, entry by entry (by index in the call)."""

    __slots__ = ("fresh", "misses", "refreshes", "values")

    def __init__(self) -> None:
        self.values: dict[int, Any] = {}  # returned as read (hits, stale values served)
        self.fresh: dict[int, bytes] = {}  # of those, the fresh ones' envelopes (what a verification compares)
        self.misses: dict[int, Any] = {}  # a Miss, a Stale value or a FailedRead: filled by a flow
        self.refreshes: dict[int, Served] = {}  # served stale or early: refreshed in the background

    def absent(self, indexes: Sequence[int], events: Reporter) -> None:
        """Entries the call's first read found absent: misses, not read again."""
        for index in indexes:
            self.misses[index] = Miss.ABSENT
        if indexes:
            events.incr("misses", len(indexes))


def read_many(
    indexes: Sequence[int],
    flights: Sequence[Flight],
    spec: LoaderSpec,
    reads: Sequence[tuple[bytes | None, float, bool]],
    keys: Sequence[str],
    events: Reporter,
    warn: WarningLog,
    random: Callable[[], float],
) -> Found:
    """What the first read of each led entry means (``call.read_found``, entry by entry)."""
    found = Found()
    for index, flight, (raw, ttl_left, failing), key in zip(indexes, flights, reads, keys, strict=True):
        decided = read_found(flight, spec, raw, ttl_left, failing, events, warn, key, random)
        if type(decided) not in DECIDED:
            found.values[index] = decided
            if raw is not None:
                found.fresh[index] = raw
        elif isinstance(decided, Served):
            found.values[index] = decided.value
            if decided.refresh is not None:
                found.refreshes[index] = decided
            if raw is not None and not decided.stale:
                found.fresh[index] = raw
        else:
            found.misses[index] = decided
    return found


def failed_reads(indexes: Sequence[int], events: Reporter, warn: WarningLog, error: BackendUnavailable) -> Found:
    """What a first read that failed means for every entry it read: one failure
    counted and warned of, a miss per entry."""
    found = Found()
    for index in indexes:
        if not found.misses:
            found.misses[index] = failed_read(events, warn, error)
        else:
            events.incr("misses")
            found.misses[index] = FailedRead(error)
    return found


def take_hits(
    raws: Sequence[bytes | None],
    decoded: Sequence[Any],
    indexes: Sequence[int],
    values: list[Any],
    events: Reporter,
    absent: set[int],
) -> list[int]:
    """A many-key call's first read (``raws``, and ``decoded`` by ``Codec.decode_hits``),
    before it joins any flight: each hit's value put in ``values``. The rest go through
    the flights. Those found ``absent`` are misses; the null sentinel and unreadable
    bytes are read again by whoever leads them, so that no value read before a caller
    joined a flight is handed to it. Returns the rest's indexes."""
    rest = []
    for index, raw, value in zip(indexes, raws, decoded, strict=True):
        if value is not NOT_A_VALUE:
            values[index] = value
            continue
        if raw is None:
            absent.add(index)
        rest.append(index)
    if len(rest) < len(indexes):
        events.incr("hits", len(indexes) - len(rest))
    return rest


def values_of(result: Any, ids: Sequence[Any], loader: str) -> list[Any]:
    """The loader's value of each of ``ids``, from what it returned: a mapping of id to
    value (an id it leaves out is None: the null sentinel is cached for it, extra ids are
    not written), or a list or tuple of one value per id, in the order asked."""
    if isinstance(result, Mapping):
        return [result.get(id_) for id_ in ids]  # ids are hashable: ``_loader_many`` refuses others
    if isinstance(result, (list, tuple)):
        if len(result) == len(ids):
            return list(result)
        raise TypeError(
            f"the many-key loader {loader} returned {len(result)} values for {len(ids)} ids: a list "
            "must hold one value per id, in the order asked; nothing was written"
        )
    raise TypeError(
        f"the many-key loader {loader} returned {type(result).__name__}, not a mapping of id to "
        "value (or a list of one value per id, in the order asked); nothing was written"
    )
