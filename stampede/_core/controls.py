"""The controls a caller takes on one entry besides calling its loader (sans-IO): ``set``
a value (``put``), ``refresh`` it now (``reload``), and ``peek`` at it (``peeked``).

Each keeps the promise of every call: one load per key at a time, and no value written
after an invalidation that completed. A write-through is an invalidation that leaves
the new value behind, so a load in flight when ``set`` ran is never written over it::

    t=0    B (another process) misses, takes the lease, loads version 1 from the database
    t=1    A writes version 2 to the database, calls set(v2): the value and B's lease
           are dropped (as invalidate() drops them), A takes the lease, writes v2 and
           wakes B's waiters with it
    t=2    B's loader returns v1: its write finds the lease gone, and is refused. B's
           caller gets v1 (its call began before A's), B's joiners read afresh: v2

A refresh is a miss that will not take the current value for an answer: its lease is
taken over the value it read (as a background refresh takes it over a stale value), and
a value that is not that one, written by any other process meanwhile, is the answer.
So refreshes and misses at the same moment, anywhere, share one load.
"""

from __future__ import annotations

import logging
from typing import Any

from .._errors import BackendUnavailable
from .codec import Codec, Kind, identity
from .config import Settings
from .effects import Decision, ReadTagClock, ReadValue
from .flow import Context, FailedRead, Flow, Miss, fill, prepare
from .freshness import Served, Stale, classify
from .results import unwrapped
from .store import Written
from .tags import Tagged

log = logging.getLogger("stampede.cache")


def put(ctx: Context, result: Any) -> Decision[bool]:
    """``set``: write ``result`` (a value, or a ``Cached`` with rules of its own) as the
    entry's value, overtaking any load in flight. Returns whether it was written: False
    if a load begun after this set's invalidation holds the lease (its value, read from
    the database after the caller's write, is at least as new and is kept), or if a tag
    of the entry was invalidated while the set ran (the invalidation wins).

    Nothing is written and the entry is left alone if the value is refused (the
    serializer, ``max_value_bytes``, a bad tag): the errors of ``prepare``."""
    value, rules = unwrapped(result)
    if rules is not None and not rules.store:
        raise ValueError("set() of Cached(store=False) would write nothing: call invalidate() instead")
    write = prepare(ctx, value, rules, ctx.wall_clock(), 0.0, handed=False)
    since = 0
    if write.tags is not None:
        since = yield ReadTagClock(write.tags.clock)  # read first: an invalidation after it wins
    tagged = Tagged(write.tags, since) if write.tags is not None else None
    # The old value, near copies and any holder's lease go, and the value is written.
    written = yield from ctx.leases.put(write.envelope, write.ttl_ms, write.inline, tagged)
    if written != Written.YES:
        log.debug("%s: set overtaken by a load that began after it, or refused by a tag", ctx.keys.value)
    done = written == Written.YES
    ctx.events.incr("sets" if done else "sets_overtaken")
    return done


def reload(ctx: Context) -> Flow:
    """``refresh``: one load now, shared with every refresh and miss of the entry at the
    same moment, and its value. Readers get the current value until it is written."""
    ctx.events.incr("refresh_calls")
    try:
        raw = yield ReadValue()
    except BackendUnavailable as error:
        return (yield from fill(ctx, FailedRead(error)))
    if raw is None:
        found: Miss | Stale = Miss.ABSENT
    elif ctx.codec.decode(raw).kind is Kind.CORRUPT:
        found = Miss.CORRUPT
    else:
        found = Stale(None, identity(raw), on_error=False, raw=raw)  # taken over, never returned
    return (yield from fill(ctx, found))


def peeked(
    raw: bytes | None, ttl_left: float, failing: bool, codec: Codec, settings: Settings
) -> tuple[Any, bool] | None:
    """``peek``: what the entry holds that a caller could be served, as ``(value, stale)``
    (value None: the null sentinel), or None if nothing is cached: no value, an
    unreadable one, or one past every stale window. A value past ``stale_while_revalidate``
    but within ``stale_if_error`` is reported stale: it is served if the loader fails."""
    if raw is None:
        return None
    if not settings.reads_ttl:  # a hit serves what GET finds, however little time it has left
        decoded = codec.decode(raw)
        return None if decoded.kind is Kind.CORRUPT else (decoded.value, False)
    found = classify(raw, ttl_left, codec, settings, _never, failing)
    if isinstance(found, Served):
        return found.value, found.stale
    if isinstance(found, Stale) and found.on_error:
        return found.value, True
    return None


def _never() -> float:
    """A draw that starts no early refresh: a peek refreshes nothing."""
    return 0.0


def no_load() -> Any:
    """The loader of a decision that never loads (``put``)."""
    raise AssertionError("set() does not call the loader")


async def ano_load() -> Any:
    """``no_load`` for the asyncio driver."""
    return no_load()
