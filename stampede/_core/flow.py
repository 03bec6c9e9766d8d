"""The miss path of one cache entry, written once, as a generator of effects (sans-IO).

Rules of the flow:

* It performs no I/O. It yields an effect (``Acquire``, ``Subscribe``, ``AwaitNotice``,
  ``Load``, ``WriteRelease``, ``Release``: the vocabulary of ``_core.effects``) and a
  performer, blocking or asyncio (``_drivers.perform``), performs it and sends the reply back
  in. A failure of the store comes back in as ``BackendUnavailable``. An exception of
  the loader comes back in as itself. Performers deliver every exception with ``throw``
  and never ``close()`` a flow that holds the lock.
* The hit path is not here: drivers read the key themselves, so a hit is one round trip.
  The flow starts after a miss, in the one caller per process that leads for the key.
* Only the holder of the lock loads and writes, and the write succeeds only if the lease
  is still the holder's (checked inside the write script). An invalidation deletes the
  lease, so a load that was in flight when it ran is never written over it. So is a load
  whose lease expired or was taken over. Such a value goes to the leader's caller only
  (``Context.unwritten``): callers who joined it in this process, perhaps after an
  invalidation in another process, start over and read afresh. So does a value whose
  write failed (the connection cut mid-write): it may have been refused.
* A waiter subscribes to the entry's channel *before* it re-checks, so a write between
  the re-check and the wait still wakes it. Any wake-up, spurious or not, leads to
  another ``Acquire``, which re-checks the value and takes over a dead holder's lock.
  the wait between two checks never exceeds the holder's remaining lease nor
  ``recheck_interval``, which bounds a lost message.
* A caller interrupted while it may hold the lock (a cancelled task, KeyboardInterrupt:
  anything but an Exception thrown into the flow at Acquire, Load or WriteRelease)
  releases it by token before the interruption goes on, so waiters elsewhere take over
  at once instead of after the lease.

A timeline of a takeover::

    t=0     A: Acquire -> locked, Load starts (watchdog renews every lock_ttl/3)
    t=0.01  B: Acquire -> held (lease 10 s left). Subscribe. Acquire -> held. AwaitNotice
    t=3     A is killed: no more renewals, nothing written, no message
    t=10    the lease expires. B's wait (bounded by the lease) ends with no notice
    t=10    B: Acquire -> locked (a takeover). B loads and writes. A's lease is gone
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._errors import (
    BackendUnavailable,
    ConfigError,
    InvalidKey,
    LoadTimeout,
    SerializationError,
    ValueTooLarge,
    WaitTimeout,
)
from . import world
from .codec import NOT_A_VALUE, Codec, Kind, identity, loaded_at_of
from .config import Settings
from .effects import (
    LEASE_MARGIN,
    SERVERS,
    AwaitNotice,
    Decision,
    Effect,
    Finish,
    LeaseLost,
    Load,
    LoadDetached,
    ReadEntryTags,
    ReadTagClock,
    SettleNotice,
    milliseconds,
)
from .freshness import Served, Stale, classify
from .keys import EntryKeys
from .leases import ON_ONE_SERVER, LeaseSteps
from .observer import Reporter, Wait, log_extra
from .results import NOT_MODIFIED, PASS_THROUGH_MS, Cached, Previous, Unkept, unwrapped
from .store import AcquireReply, LockState, Written
from .tags import TAGGED_LOAD_LIMIT, Tagged, Tagging, TagSet
from .verify import Sample

Flow = Decision[Any]


class WarningLog(Protocol):
    """Where the flow warns, at most every few seconds per kind. ``key`` and ``outcome``
    become the record's structured fields (``_core.observer.log_extra``)."""

    def warning(self, message: str, *args: object, key: str = "", outcome: str = "") -> None: ...


log = logging.getLogger("stampede.cache")


def produces_value(effect: Effect) -> bool:
    """Whether the value a flow returns may come from this step: a command to the cache,
    or a load without the lease. Waiting does not. A leased load's value is decided by
    the write that follows it. Callers who arrive after such a step began are not handed
    its value (see ``_core.flight``).

    A lock server's command does not either: it never reads or writes the value. Counting
    one would be wrong, not only wasteful. Redlock releases its majority after the write,
    and a caller who arrived during that release would be handed a value written before
    it arrived."""
    if isinstance(effect, Load):
        return not effect.leased
    return not isinstance(effect, NOT_THE_VALUE)


NOT_THE_VALUE = (
    AwaitNotice,
    SettleNotice,
    ReadTagClock,
    ReadEntryTags,
    Finish,
    *SERVERS,
)  # the steps that never produce the value


# --- the context of one miss ---------------------------------------------------------


@dataclass(slots=True)
class Context:
    """What one run of the flow works with. Clocks and randomness are injected so the
    flow's decisions can be tested without a server and without sleeping."""

    keys: EntryKeys
    settings: Settings
    codec: Codec
    events: Reporter
    warn: WarningLog
    clock: Callable[[], float]  # monotonic seconds: deadlines, load duration
    wall_clock: Callable[[], float]  # epoch seconds: loaded_at in the envelope
    uniform: Callable[[float, float], float]  # TTL jitter
    unwritten: bool = False  # the loaded value's write was refused, or failed (see _load_and_write)
    # The value came in a message: written by another process at some point after this
    # flow subscribed, perhaps before an invalidation that a message still on its way
    # would have announced. The driver shares it only with callers who arrived before
    # the subscription (see _core.flight).
    via_notice: bool = False
    # The value returned is a stale one the first read found (stale_if_error), read
    # before anything else this flow did: the driver shares it only with callers who
    # arrived before that read.
    served_stale: bool = False
    load_error: BaseException | None = None  # what the loader raised, when LOAD_FAILED was returned
    # The envelope the returned value was read from, or written as: a joiner of another
    # loader, or one that needs an object of its own, decodes it (see _core.flight).
    raw: bytes | None = None
    # Where the lease is held, step by step: the layer's policy bound to this load's
    # lease (``_core.leases``). The cache server alone unless the driver binds another.
    leases: LeaseSteps = ON_ONE_SERVER
    tags: TagSet | None = None  # the entry's tags (``_core.tags``), None if its loader has none
    previous: bytes | None = None  # the envelope a load refreshes, which its loader may keep (NOT_MODIFIED)
    holder: str = ""  # the token of the last lease found held by another, if its store tells (traces read it)
    # When the call began, or later (monotonic): a load without the lease another caller
    # of this process began after it is this call's to share (``_core.flight.shares_fallback``).
    began: float = 0.0


@dataclass(frozen=True)
class LoaderSpec:
    """What a driver needs to know of one decorated loader. ``reads_ttl``,
    ``reads_failing``, ``near`` and ``near_shared`` are the settings' answers, worked out
    once for the hit path."""

    func: Callable[..., Any]
    settings: Settings
    codec: Codec
    tags: Tagging | None = None  # what the entries are tagged with (``_core.tags``)
    name: str = ""  # the key template: what logs and traces name its entries by
    verify_equal: Callable[[Any, Any], bool] | None = None  # the loader's comparator for verifications
    reads_ttl: bool = field(init=False)
    reads_failing: bool = field(init=False)
    near: bool = field(init=False)  # served from the near cache, when the layer has one
    near_shared: bool = field(init=False)  # its callers share one object
    own_copies: bool = field(init=False)  # each caller gets an object of its own, even a joiner
    verify: Sample | None = field(init=False)  # which hits are verified (``_core.verify``), None: none

    def __post_init__(self) -> None:
        object.__setattr__(self, "reads_ttl", self.settings.reads_ttl)
        object.__setattr__(self, "reads_failing", self.settings.reads_failing)
        object.__setattr__(self, "near", bool(self.settings.near_cache))
        object.__setattr__(self, "near_shared", self.settings.near_cache == "shared")
        object.__setattr__(self, "own_copies", self.near and not self.near_shared)
        object.__setattr__(self, "verify", Sample(self.settings.verify_sample) if self.settings.verify_sample else None)


def new_context(
    value_key: str, spec: LoaderSpec, events: Reporter, warn: WarningLog, tags: TagSet | None = None
) -> Context:
    """The context of one miss, on the real clocks."""
    keys = EntryKeys.for_value(value_key)
    return Context(
        keys,
        spec.settings,
        spec.codec,
        events,
        warn,
        world.monotonic,
        world.wall,
        world.uniform,
        tags=tags,
        began=world.monotonic(),
    )


# --- the flow --------------------------------------------------------------------------


class Miss(enum.Enum):
    """Why the first read of a call did not return a value."""

    ABSENT = "absent"  # nothing at the key
    CORRUPT = "corrupt"  # unreadable bytes at the key: the lock is taken over them


@dataclass(frozen=True)
class FailedRead:
    """The first read failed: the store is not asked again, so a stalled server costs one
    socket timeout, not one per step. ``error`` is what callers see under policy "raise"."""

    error: BackendUnavailable


def first_read(raw: bytes | None, codec: Codec, events: Reporter, warn: WarningLog, key: str) -> Any:
    """What a call's first read found: the value to return (None for the null sentinel),
    or a ``Miss``. A hit never enters the flow. (The drivers call ``_core.call.read_found``,
    which decides a hit itself and the rest here, in ``past_the_hit``.)"""
    if raw is not None:
        value = codec.decode_hit(raw)
        if value is not NOT_A_VALUE:
            events.incr("hits")
            return value
    return past_the_hit(raw, codec, events, warn, key)


def past_the_hit(raw: bytes | None, codec: Codec, events: Reporter, warn: WarningLog, key: str) -> Any:
    """``first_read`` for what ``Codec.decode_hit`` did not take: the null sentinel (None),
    or a ``Miss`` (nothing at the key, or unreadable bytes)."""
    if raw is not None:
        decoded = codec.decode(raw)
        if decoded.kind is Kind.NULL:
            events.incr("null_hits")
            return None
        note_corrupt(events, warn, key, decoded.problem)
        miss = Miss.CORRUPT
    else:
        miss = Miss.ABSENT
    events.incr("misses")
    return miss


def fresh_read(
    raw: bytes | None,
    ttl_left: float,
    failing: bool,
    spec: LoaderSpec,
    events: Reporter,
    warn: WarningLog,
    key: str,
    random: Callable[[], float],
) -> Served | Stale | Miss:
    """``first_read`` for a loader with freshness settings, whose read also returned the
    value's remaining TTL and whether its loader is failing: a value to return now
    (perhaps stale, perhaps with a refresh to start), a ``Stale`` value for the miss path,
    or a ``Miss``."""
    if raw is None:
        events.incr("misses")
        return Miss.ABSENT
    found = classify(raw, ttl_left, spec.codec, spec.settings, random, failing)
    if isinstance(found, Served):
        if found.on_error:
            events.incr("stale_on_error")
        else:
            events.incr("stale_hits" if found.stale else "hits" if found.value is not None else "null_hits")
        return found
    if found is None:
        note_corrupt(events, warn, key, spec.codec.decode(raw).problem)
    events.incr("misses")
    return Miss.CORRUPT if found is None else found


def failed_read(events: Reporter, warn: WarningLog, error: BackendUnavailable) -> FailedRead:
    """What a call's first read means when the store failed to answer it."""
    note_backend_error(events, warn, error)
    events.incr("misses")
    return FailedRead(error)


def fill(ctx: Context, miss: Miss | FailedRead | Stale = Miss.ABSENT) -> Flow:
    """Get the entry's value after a miss: wait for another holder, or lock, load and write.
    After a ``Stale`` read, the lease is taken over the stale value, and under
    ``stale_if_error`` that value is returned if the load fails, if a failed load's hold
    is on the lease, or if the wait for another holder times out."""
    if isinstance(miss, FailedRead):
        return (yield from _backend_failed(ctx, miss.error, counted=True))
    wait = Wait(ctx.events, ctx.clock)
    try:
        return (yield from _fill(ctx, miss, wait))
    finally:
        wait.end("error")  # still open: an exception or an interruption ended it


@dataclass(slots=True)
class _Filling:
    """What one caller's fill knows between two acquisitions (``_fill``'s loop)."""

    deadline: float  # the caller's wait_timeout runs out (``ctx.clock``)
    fallback: Stale | None  # what a failed load serves, within stale_if_error
    check_value: bool  # the next acquisition reads the value (not after a corrupt one)
    taken_over: bytes  # the lease is taken over this value only (a stale one's identity)
    subscribed: bool = False  # to the entry's channel: no wake-up can be missed now
    load_deadline: float = math.inf  # nobody waits longer for one load (set when the wait begins)
    silent_wait: bool = False  # the last wait ended with no message: a dead holder is possible


class _Step(enum.Enum):
    AGAIN = "again"  # a step's outcome when the fill must acquire again


_AGAIN = _Step.AGAIN


def _fill(ctx: Context, miss: Miss | Stale, wait: Wait) -> Flow:
    """Acquire until the call has its value: found on a re-check (``_found``), loaded
    under the lease (``_taking_over``, ``_load_and_write``, ``_loaded``: the load is
    driven from here, one generator less between it and the performer), or waited for
    while another holder loads (``_held``). Each step gives the call's value, or ``_AGAIN``."""
    stale = miss if isinstance(miss, Stale) else None
    deadline = ctx.clock() + ctx.settings.wait_timeout
    if stale is None:  # the common case, a miss: positional, which costs half as much
        filling = _Filling(deadline, None, miss is not Miss.CORRUPT, b"")
    else:
        filling = _Filling(deadline, stale if stale.on_error else None, True, stale.identity)
    if stale is not None and stale.raw is not None:
        ctx.previous = stale.raw
    while True:
        try:
            reply = yield from ctx.leases.acquire(filling.check_value, filling.taken_over)
        except BaseException as error:
            failure = yield from _interrupted(ctx, error)
            wait.end("error")
            return (yield from _backend_failed(ctx, failure))
        if reply.state is LockState.VALUE:
            outcome = _found(ctx, filling, reply, wait)
        elif reply.state is LockState.LOCKED:
            if filling.subscribed:  # a waiter's: its last holder's value may be in its message
                settled = yield from _settle(ctx)
                if settled is not NOT_A_VALUE:
                    wait.end("value")
                    return settled
            hold = _taking_over(ctx, filling, wait)
            since, fallback, deadline = reply.since, filling.fallback, filling.load_deadline
            loaded = yield from _load_and_write(ctx, hold, fallback=fallback, deadline=deadline, since=since)
            outcome = _loaded(ctx, filling, loaded)
        else:
            outcome = yield from _held(ctx, filling, reply, wait)
        if outcome is not _AGAIN:
            return outcome


def _found(ctx: Context, filling: _Filling, reply: AcquireReply, wait: Wait) -> Any:
    """A value on re-check: the call's, unless it is corrupt (read past) or past its ttl
    (an expire() since the first read: never fresh again, so the lease is taken over it
    as after a stale first read, and within stale_if_error a failed load serves it)."""
    assert reply.raw is not None
    key = ctx.keys.value
    decoded = ctx.codec.decode(reply.raw)
    if decoded.kind is Kind.CORRUPT:
        _corrupt(ctx, decoded.problem)
        filling.check_value = False
        return _AGAIN
    if 0 <= reply.ttl_left <= decoded.stale_for:
        log.debug("%s: the value found on re-check is past its ttl; refreshing it", key)
        on_error = decoded.stale_for - reply.ttl_left < ctx.settings.stale_if_error
        stale = Stale(decoded.value, identity(reply.raw), on_error=on_error, raw=reply.raw)
        filling.taken_over, ctx.previous = stale.identity, reply.raw
        if filling.fallback is None and stale.on_error:
            filling.fallback = stale
        return _AGAIN
    log.debug("%s: value found on re-check", key)
    wait.end("value")
    ctx.raw = reply.raw
    return decoded.value


def _taking_over(ctx: Context, filling: _Filling, wait: Wait) -> float:
    """The lease is this caller's, to load under (a takeover, if the holder it waited
    for went silent): how long a failed load's hold keeps it."""
    wait.end("takeover")
    if filling.silent_wait:
        ctx.events.incr("takeovers")
        log.info(
            "%s: the holder's lease ran out with nothing written; taking over",
            ctx.keys.value,
            extra=log_extra(ctx.keys.value, "takeover"),
        )
    return ctx.settings.stale_retry_interval if filling.fallback is not None else 0.0


def _loaded(ctx: Context, filling: _Filling, value: Any) -> Any:
    """What the load under the lease comes to: its value, the stale value a failed load
    serves, its error, or ``_AGAIN`` (the lease was lost before it began)."""
    if value is LEASE_LOST:  # invalidated while its load waited for a budget slot
        filling.check_value = True  # start over: another caller may be loading the key now
        return _AGAIN
    if value is LOAD_FAILED:
        if filling.fallback is None:  # a load cancelled at load_timeout: its hold keeps the lease
            assert ctx.load_error is not None
            raise ctx.load_error
        return _serve_stale(ctx, filling.fallback, "the load failed")
    return value


def _held(ctx: Context, filling: _Filling, reply: AcquireReply, wait: Wait) -> Flow:
    """Another holder is loading, and what it writes is fresh: subscribe to its message
    once (then re-check, so that no wake-up is missed), and after that wait for it within
    every bound (the call's wait_timeout, the load's bound, the holder's lease,
    recheck_interval). A value in the message is the call's; any other wake-up, or none,
    means acquire again."""
    settings, fallback = ctx.settings, filling.fallback
    if fallback is not None and reply.failed:
        wait.end("error")
        return _serve_stale(ctx, fallback, "a failed load's hold is on the lease")
    filling.check_value = True
    if reply.holder:
        ctx.holder = reply.holder
    if not filling.subscribed:
        ctx.events.incr("lock_waits")
        wait.begin()
        bound = _load_bound(settings, fallback)
        if bound:  # nobody waits longer than that for one load (see _core.effects.Load),
            # from when the call began: a caller that started over (its leader's stale
            # value was read before it arrived) does not wait the bound a second time.
            filling.load_deadline = min(ctx.clock(), ctx.began or math.inf) + bound
        log.debug("%s: lock held elsewhere (%.3f s left); subscribing", ctx.keys.value, reply.lease_left)
        try:
            yield from ctx.leases.subscribe()
        except BackendUnavailable as error:
            wait.end("error")
            return (yield from _backend_failed(ctx, error))
        filling.subscribed = True
        return _AGAIN  # re-check now that no wake-up can be missed
    if ctx.clock() >= filling.load_deadline:
        wait.end("timeout")
        return _load_timed_out(ctx, fallback, "the load it waited for ran past")
    remaining = min(filling.deadline, filling.load_deadline) - ctx.clock()
    if remaining <= 0:
        wait.end("timeout")
        if fallback is not None:
            ctx.events.incr("wait_timeouts")
            return _serve_stale(ctx, fallback, "the wait for another load timed out")
        return (yield from after_wait_timeout(ctx))
    lease_left = reply.lease_left if reply.lease_left > 0 else settings.lock_ttl
    timeout = min(remaining, lease_left + LEASE_MARGIN, settings.recheck_interval)
    try:
        notice = yield AwaitNotice(timeout)
    except BackendUnavailable as error:
        wait.end("error")
        return (yield from _backend_failed(ctx, error))
    filling.silent_wait = notice is None
    if notice:
        decoded = ctx.codec.decode(notice)
        if decoded.kind is not Kind.CORRUPT:
            log.debug("%s: woken with the value", ctx.keys.value)
            wait.end("value")
            ctx.via_notice, ctx.raw = True, notice
            return decoded.value
    log.debug("%s: %s; re-checking", ctx.keys.value, "no message" if notice is None else "state changed")
    return _AGAIN


def _settle(ctx: Context) -> Flow:
    """A waiter took the lease on a re-check: its holder had gone. A holder that handed
    its value to its waiters only (``Cached(store=False)``) left nothing to re-check, and
    its message may still be on its way: take the value from it (it was written after
    this caller subscribed) and give the lease back, rather than load again.
    ``NOT_A_VALUE``: nothing came, the lease is kept, and the caller loads."""
    try:
        notice = yield SettleNotice()
    except BaseException as error:
        yield from _interrupted(ctx, error)
        return NOT_A_VALUE
    if not notice:
        return NOT_A_VALUE
    decoded = ctx.codec.decode(notice)
    if decoded.kind is Kind.CORRUPT:
        return NOT_A_VALUE
    log.debug("%s: the lease was free; its last holder's value came in its message", ctx.keys.value)
    yield from _release(ctx)
    ctx.via_notice, ctx.raw = True, notice
    return decoded.value


def _interrupted(ctx: Context, error: BaseException) -> Decision[BackendUnavailable]:
    """What ``error``, raised at a step taken while the lease may be this caller's, means:
    a failure of the store comes back, for the step's caller to decide what it means
    there. An interruption (a cancelled task, KeyboardInterrupt), with the command
    possibly run, releases the lease by token and goes on: releasing is safe either way,
    and waiters need not wait out a lease nobody renews. A closed flow (``GeneratorExit``)
    yields nothing more. Called from the step's ``except``, so that the step itself runs
    with no generator between it and its performer (the ladder costs nothing until it is
    climbed)."""
    if isinstance(error, BackendUnavailable):
        return error
    if not isinstance(error, GeneratorExit):
        yield from _release(ctx)
    raise error


def _unwritten(ctx: Context, error: BackendUnavailable, value: Any) -> Flow:
    """A write (or a touch) the store failed to answer: ``value`` is this caller's, not
    its joiners' (the write may have run or not), and the lease is released unless the
    store timed out (a stalled server would hold this caller for another timeout)."""
    _count_backend_error(ctx, error)
    ctx.unwritten = True
    if not error.timed_out:
        yield from _release(ctx)
    return value


def _load_uncached(ctx: Context) -> Flow:
    """Call the loader without a lease. Its value is not cached, but goes to its caller as
    a cached one would (read back through the serializer), so every caller sees one form."""
    ctx.events.incr("loads")
    started = ctx.clock()
    ctx.events.began("load")
    try:
        value = yield _load(False, ctx.settings.load_timeout, detach=not ctx.settings.cancel_on_timeout)
    except LoadDetached:  # nothing will be written: its value goes to nobody
        ctx.events.ended("load", "error", ctx.clock() - started)
        return _load_timed_out(ctx, None, "the load ran past", "it goes on, its value to nobody (no lease)")
    except BaseException as error:
        ctx.events.ended("load", "error", ctx.clock() - started)
        if isinstance(error, LoadTimeout):
            ctx.events.incr("load_timeouts")
        raise
    value, _ = unwrapped(value)  # written nowhere: a Cached's rules have nothing to rule
    ctx.events.ended("load", "none" if value is None else "value", ctx.clock() - started)
    envelope, _, plain = ctx.codec.encode_counted(value, ctx.wall_clock(), 0.0, key=ctx.keys.value)
    value = ctx.codec.read_back(envelope, key=ctx.keys.value, plain=plain)
    ctx.raw = envelope
    return value


def after_wait_timeout(ctx: Context) -> Flow:
    """A caller waited ``wait_timeout`` for another load: load uncached, or raise."""
    ctx.events.incr("wait_timeouts")
    key = ctx.keys.value
    if ctx.settings.on_wait_timeout == "raise":
        raise WaitTimeout(
            f"gave up waiting {ctx.settings.wait_timeout} s for another caller to load {key!r}",
            key=key,
        )
    ctx.warn.warning(
        "stampede: waited %s s for another load of %r; loading without caching",
        ctx.settings.wait_timeout,
        key,
        key=key,
        outcome="wait_timeout",
    )
    return (yield from _load_uncached(ctx))


def refresh(ctx: Context, stale: bytes, life_left: float = -1.0, previous: bytes | None = None) -> Decision[None]:
    """A background refresh of a value whose identity is ``stale``: take the lease over it,
    unless another process holds the lease or has already written another value, then
    load and write as a miss does. ``life_left``: the seconds the store keeps the value
    (its TTL when read, -1: no TTL).

    A failing loader leaves a hold (``Hold``), so the key is retried once per
    ``stale_retry_interval`` while its stale value is served. The hold never outlives that
    value. With no stale window, or once the value is gone, nobody is served a stale value
    while it holds: the next caller would wait for nobody. So the lease is released, as
    after a failed load, and the next caller loads at once."""
    key = ctx.keys.value
    ctx.previous = previous
    gone_at = math.inf if life_left < 0 else ctx.clock() + life_left
    try:
        reply = yield from ctx.leases.acquire(True, stale)
    except BaseException as error:
        _count_backend_error(ctx, (yield from _interrupted(ctx, error)))
        return
    if reply.state is not LockState.LOCKED:
        log.debug("%s: no refresh: %s", key, "already refreshed" if reply.raw else "the lease is held")
        return
    ctx.events.incr("refreshes")
    log.debug("%s: refreshing in the background", key)

    hold = ctx.settings.stale_retry_interval if ctx.settings.stale_window else 0.0
    try:
        result = yield from _load_and_write(ctx, hold, hold_until=gone_at, since=reply.since)
    except LoadTimeout as error:  # it goes on (or was cancelled): nobody waits for a refresh
        log.info("%s: the background refresh %s", key, error)
        return
    except Unkept:
        log.debug("%s: the background refresh's answer is not to be kept; the old value stays", key)
        return
    except Exception as error:
        if error is not ctx.load_error:
            raise  # not the loader's: a serializer's error, say (the refresher warns)
        result = LOAD_FAILED
    if result is LEASE_LOST:
        log.debug("%s: the refresh's lease was taken while it waited for a budget slot; not loaded", key)
    elif result is LOAD_FAILED:
        ctx.events.incr("refresh_errors")
        failure = ctx.load_error
        ctx.warn.warning(
            "stampede: the background refresh of %r failed (%s: %s); %s",
            key,
            type(failure).__name__,
            failure,
            "its stale value is still served" if ctx.settings.stale_window else "the next caller after its ttl loads",
            key=key,
            outcome="refresh_error",
        )


class _LoadFailed(enum.Enum):
    LOAD_FAILED = "load failed"
    LEASE_LOST = "lease lost"


LOAD_FAILED = _LoadFailed.LOAD_FAILED
"""What ``_load_and_write`` returns when the loader raised and a hold now keeps the lease
(the error is in ``Context.load_error``)."""

LEASE_LOST = _LoadFailed.LEASE_LOST
"""What ``_load_and_write`` returns when the loader never ran: an invalidation took the
lease while the load waited for a slot of its budget (``LeaseLost``). Nothing is held."""


def _serve_stale(ctx: Context, stale: Stale, why: str) -> Any:
    ctx.events.incr("stale_on_error")
    ctx.served_stale = True
    log.info(
        "%s: %s; serving the stale value (stale_if_error)",
        ctx.keys.value,
        why,
        extra=log_extra(ctx.keys.value, "stale_on_error"),
    )
    return stale.value


def _load_and_write(
    ctx: Context,
    hold: float = 0.0,
    hold_until: float = math.inf,
    fallback: Stale | None = None,
    deadline: float = math.inf,
    since: int | None = None,
) -> Flow:
    """Load under the lease and write the value. If the loader raises an Exception, the
    lease becomes a hold of ``hold`` seconds, ending by ``hold_until`` (``ctx.clock``),
    and ``LOAD_FAILED`` is returned. With no time left for a hold, the lease is released
    and the error raised. Either way the error is kept in ``Context.load_error``.
    ``LEASE_LOST``: the loader never ran, its lease taken while it waited for a budget slot
    (what was left of it is released).

    A load that runs past its timeout (``load_soft_timeout`` with a ``fallback`` in hand,
    else ``load_timeout``) goes on under its lease and is written when it ends, while its
    caller gets the fallback or ``LoadTimeout`` (``_detached``). An async one cancelled at
    ``load_timeout`` leaves a hold of ``load_timeout``, so the waiters it wakes do not load
    again before they give up too. ``deadline`` (``ctx.clock``): a caller who waited for
    another load before this one gives up on both by then. ``since``: a tagged load's
    tag clock, if the lease's step read it (``AcquireReply.since``); else it is read here,
    one round trip more."""
    key, settings = ctx.keys.value, ctx.settings
    if ctx.tags is None:
        since = 0
    elif since is None:
        try:
            since = yield ReadTagClock(ctx.tags.clock)  # the load begins now (see _core.tags)
        except BaseException as error:
            failure = yield from _interrupted(ctx, error)
            yield from _release(ctx)
            return (yield from _backend_failed(ctx, failure))
    loaded_at, started = ctx.wall_clock(), ctx.clock()
    ctx.events.incr("loads")
    ctx.events.began("load")
    log.debug("%s: lock taken; loading", key)
    timeout = _load_bound(settings, fallback)
    if timeout and deadline < math.inf:
        timeout = max(0.001, min(timeout, deadline - ctx.clock()))
    soft = fallback is not None and bool(settings.load_soft_timeout)  # a soft timeout cancels nothing
    try:
        value = yield _load(True, timeout, soft or not settings.cancel_on_timeout, _previous(ctx))
    except LoadDetached as late:
        return (yield from _detached(ctx, late, fallback, since, loaded_at, started))
    except LeaseLost:
        ctx.events.ended("load", "error", ctx.clock() - started)  # as a load given no slot
        # What is left of the lease is given back, by token: a lease on lock servers
        # (Redlock) is lost with its majority, while its key on the cache server, taken
        # after an invalidation dropped the majority, would hold every caller off.
        yield from _release(ctx)
        return LEASE_LOST
    except GeneratorExit:
        ctx.events.ended("load", "error", ctx.clock() - started)
        raise  # closed by its driver: nothing may be yielded now. The lease runs out
    except Unkept:
        # An answer for its caller alone, not a failure: no hold, no stale in its place.
        ctx.events.ended("load", "value", ctx.clock() - started)
        ctx.events.incr("uncached_results")
        yield from _release(ctx)
        raise
    except BaseException as error:
        ctx.events.ended("load", "error", ctx.clock() - started)
        if isinstance(error, LoadTimeout):  # cancelled at load_timeout (async)
            ctx.events.incr("load_timeouts")
            hold = max(hold, settings.load_timeout)
        if isinstance(error, Exception):
            ctx.events.incr("loader_errors")
            ctx.load_error = error
            hold = min(hold, hold_until - ctx.clock())
            if hold > 0:
                log.debug("%s: the loader raised %s; holding the lock", key, type(error).__name__)
                try:
                    yield from ctx.leases.hold(milliseconds(hold), milliseconds(settings.stale_window))
                except BackendUnavailable:
                    pass  # the lease runs out by itself
                return LOAD_FAILED
        log.debug("%s: the loader raised %s; releasing the lock", key, type(error).__name__)
        yield from _release(ctx)
        raise
    return (yield from _write_loaded(ctx, value, since, loaded_at, started))


def _write_loaded(ctx: Context, value: Any, since: int, loaded_at: float, started: float) -> Flow:
    """The rest of ``_load_and_write`` once the loader returned ``value``: write it under
    the lease (or refuse to), and return it as readers will get it."""
    key = ctx.keys.value
    value, rules = unwrapped(value)
    if value is NOT_MODIFIED:
        return (yield from _keep_previous(ctx, since, started, rules))
    ctx.events.ended("load", "none" if value is None else "value", ctx.clock() - started)
    try:
        write = prepare(ctx, value, rules, loaded_at, ctx.clock() - started)
    except (SerializationError, ConfigError, InvalidKey):
        yield from _release(ctx)
        raise
    value, tagged = write.value, None
    if rules is not None and not rules.store:
        ctx.events.incr("uncached_results")
    if write.tags is not None:
        if ctx.clock() - started > TAGGED_LOAD_LIMIT:
            # A tag invalidated during so long a load may have forgotten it was (its
            # generation is gone): nothing is written, the caller gets its value.
            ctx.unwritten = True
            ctx.events.incr("stale_writes_prevented")
            log.info("%s: a tagged load ran past %.0f s; result not written", key, TAGGED_LOAD_LIMIT)
            yield from _release(ctx)
            return value
        tagged = Tagged(write.tags, since)
    try:
        written = yield from ctx.leases.write_release(write.envelope, write.ttl_ms, write.inline, tagged)
    except BaseException as error:
        failure = yield from _interrupted(ctx, error)
        # The value is good for this caller. But whether the write ran, or was refused
        # because an invalidation took the lease, is unknown: not for the joiners. An error
        # reply (OOM) ran nothing, and a cut connection may not have: release the lease so
        # that waiters elsewhere retry now rather than after it runs out (by token: if the
        # write did run, the lease is gone and nothing is released). Not after a timeout:
        # a stalled server would hold this caller for another one. The lease runs out.
        return (yield from _unwritten(ctx, failure, value))
    if written != Written.YES:  # the stores reply a Written (an int: True and False also do)
        # The lease was lost during the load: invalidated, or expired while this holder
        # was paused. The value is returned to this caller, whose call began before. But
        # it may predate an invalidation, so it is not handed to the process's joiners.
        ctx.unwritten = True
        ctx.events.incr("stale_writes_prevented")
        if written == Written.VANISHED and ctx.clock() - started < ctx.settings.lock_ttl - LEASE_MARGIN:
            # Gone within its first term, with no invalidation: the server dropped it.
            ctx.events.incr("evicted_leases")
            ctx.warn.warning(
                "stampede: the lease of %r vanished mid-load without an invalidation: the server "
                "evicted it (maxmemory-policy is not noeviction) or lost it (restart, failover); "
                "another caller may have loaded at the same time. Set maxmemory-policy noeviction",
                key,
                key=key,
                outcome="evicted_lease",
            )
        else:
            log.info(
                "%s: lease lost during the load (invalidated or expired); result not written",
                key,
                extra=log_extra(key, "stale_write_prevented"),
            )
    else:
        log.debug("%s: written (for %d ms) and released", key, write.ttl_ms)
    return value


def _keep_previous(ctx: Context, since: int, started: float, rules: Cached[Any] | None) -> Flow:
    """The loader answered ``NOT_MODIFIED``: the value it refreshes stays, fresh again. Its
    expiry is set again (``Touch``: ``Cached(NOT_MODIFIED, ttl=...)`` gives it a ttl of its
    own), its bytes are not written. An entry with tags is written again instead, as its
    load's value: its tags admit it anew."""
    key, raw = ctx.keys.value, ctx.previous
    if raw is None:
        ctx.events.ended("load", "error", ctx.clock() - started)
        yield from _release(ctx)
        raise ValueError(f"the loader of {key!r} returned NOT_MODIFIED, but its load refreshed no value")
    decoded = ctx.codec.decode(raw)
    ctx.events.incr("not_modified")
    if ctx.tags is not None:  # written again under every tag it had, its own included
        try:
            names = yield ReadEntryTags()
        except GeneratorExit:
            raise
        except BaseException:
            ctx.events.ended("load", "error", ctx.clock() - started)
            yield from _release(ctx)
            raise
        again = Cached(decoded.value, ttl=None if rules is None else rules.ttl, tags=names or ())
        return (yield from _write_loaded(ctx, again, since, decoded.loaded_at, started))
    ctx.events.ended("load", "none" if decoded.value is None else "value", ctx.clock() - started)
    settings = ctx.settings
    ttl = settings.null_ttl if decoded.kind is Kind.NULL else settings.ttl
    if rules is not None and rules.ttl is not None:
        ttl = rules.ttl
    ttl_ms = milliseconds(_jittered(ctx, ttl) + decoded.stale_for)
    ctx.raw = raw
    try:
        kept = yield from ctx.leases.touch(identity(raw), ttl_ms)
    except BaseException as error:
        return (yield from _unwritten(ctx, (yield from _interrupted(ctx, error)), decoded.value))
    if kept != Written.YES:
        ctx.unwritten = True  # invalidated meanwhile, or the value is another: not for the joiners
        log.info("%s: the value kept as not modified was gone or replaced; nothing kept", key)
    return decoded.value


@dataclass(frozen=True, slots=True)
class Write:
    """A value made ready to write (``prepare``)."""

    envelope: bytes
    value: Any  # as every reader will get it (read back through the serializer)
    ttl_ms: int  # how long the store keeps it: its ttl, jittered, plus the stale window
    inline: bool  # the envelope travels in the wake-up message
    tags: TagSet | None  # the entry's tags and the value's own (None: an untagged write)


def prepare(
    ctx: Context, value: Any, rules: Cached[Any] | None, loaded_at: float, duration: float, handed: bool = True
) -> Write:
    """The write of ``value`` under the loader's settings and the value's own ``rules``
    (``Cached``), or the error that writes nothing: ``SerializationError`` (the
    serializer refuses it, or it exceeds ``max_value_bytes``), ``ConfigError`` (value
    tags on a loader declared without ``tags=``), ``InvalidKey`` (a tag no tag could be).
    A ``store=False`` value is written for ``PASS_THROUGH_MS`` (0: kept by nobody, only
    handed to the load's waiters, ``_core.results``), its tags checked as a kept value's are.
    ``handed``: the value read back is handed to a caller; else (a ``set``) it is read
    back only to check it can be, which a serializer that always ``reads_back`` spares
    (``Write.value`` is then None)."""
    key, settings = ctx.keys.value, ctx.settings
    keep = rules is None or rules.store
    stale_for = settings.stale_window if keep else 0.0
    envelope, saved, plain = ctx.codec.encode_counted(value, loaded_at, duration, key=key, stale_for=stale_for)
    if len(envelope) + saved > settings.max_value_bytes:  # the size readers expand it to
        raise ValueTooLarge(
            f"the value loaded for {key!r} encodes to {len(envelope) + saved} bytes, more than "
            f"max_value_bytes={settings.max_value_bytes}; nothing was written",
            key=key,
        )
    if saved:
        ctx.events.incr("compressed_bytes_saved", saved)
    if handed or not getattr(ctx.codec.serializer, "reads_back", False):
        value = ctx.codec.read_back(envelope, key=key, plain=plain)  # not expanded again
        null = value is None  # kept for null_ttl
    else:
        null, value = value is None, None  # JSON: only None reads back as None
    ctx.raw = envelope
    tags = ctx.tags
    if rules is not None and rules.tags:
        if tags is None:
            raise ConfigError(
                f"the loader of {key!r} returned Cached(tags=...), but was decorated without tags=: declare "
                "tags=[...] (or tags=[] if every tag comes from values), so its loads read the tag clock first; "
                "nothing was written"
            )
        tags = tags.joined(rules.tags, settings.max_key_length)
    if not keep:
        # Kept by nobody, but checked as a kept value is: a tag invalidated during the
        # load refuses it, so its waiters get no value the invalidation replaced.
        return Write(envelope, value, PASS_THROUGH_MS, True, tags if tags is not None and tags.tags else None)
    ttl = rules.ttl if rules is not None and rules.ttl is not None else None
    if ttl is None:
        ttl = settings.null_ttl if null else settings.ttl
    ttl_ms = milliseconds(_jittered(ctx, ttl) + stale_for)
    inline = len(envelope) <= settings.inline_value_limit
    return Write(envelope, value, ttl_ms, inline, tags if tags is not None and tags.tags else None)


def _load(leased: bool, timeout: float, detach: bool, previous: Previous | None = None) -> Load:
    """The ``Load`` step: bounded by ``timeout`` if there is one."""
    if not timeout:
        return Load(leased, previous=previous) if previous is not None else Load(leased)
    return Load(leased, timeout, detach, previous)


def _previous(ctx: Context) -> Previous | None:
    """What a load of ``ctx`` refreshes, for its loader (``_core.results.previous``)."""
    raw = ctx.previous
    loaded_at = None if raw is None else loaded_at_of(raw)
    return None if raw is None or loaded_at is None else Previous(raw, ctx.codec, loaded_at)


def _load_bound(settings: Settings, fallback: Stale | None) -> float:
    """How long a caller waits for one load (0: as long as it takes): the soft timeout
    with a stale value to serve instead, else the hard one."""
    if fallback is not None and settings.load_soft_timeout:
        return settings.load_soft_timeout
    return settings.load_timeout


def _load_timed_out(
    ctx: Context, fallback: Stale | None, why: str, after: str = "it goes on, and writes its value when it ends"
) -> Any:
    """The answer of a caller whose load ran past its bound: the stale value it holds
    (counted as a soft timeout if that bound was the soft one), else ``LoadTimeout``."""
    settings, key = ctx.settings, ctx.keys.value
    soft = fallback is not None and bool(settings.load_soft_timeout)
    ctx.events.incr("soft_timeouts" if soft else "load_timeouts")
    bound = _load_bound(settings, fallback)
    if fallback is not None:
        return _serve_stale(ctx, fallback, f"{why} {'load_soft_timeout' if soft else 'load_timeout'}={bound} s")
    raise LoadTimeout(f"{why} load_timeout={bound} s for {key!r}; {after}", key=key)


def _detached(
    ctx: Context, late: LoadDetached, fallback: Stale | None, since: int, loaded_at: float, started: float
) -> Flow:
    """The leader's load ran past its bound and goes on: it is finished in the background
    (``_finish_detached``, on a context of its own), and the leader answers its caller now."""
    yield Finish(late.pending, functools.partial(_finish_detached, dataclasses.replace(ctx), since, loaded_at, started))
    ctx.unwritten = True  # nothing this flow wrote: joiners of a value start over
    return _load_timed_out(ctx, fallback, "the load ran past")


def _finish_detached(
    ctx: Context, since: int, loaded_at: float, started: float, value: Any, error: BaseException | None
) -> Decision[None]:
    """A detached load ended: write its value under its lease, as if its caller had
    waited (``_write_loaded``), or release the lease after an error, which nobody is
    left to be told but the log."""
    if error is None:
        yield from _write_loaded(ctx, value, since, loaded_at, started)
        return
    ctx.events.ended("load", "error", ctx.clock() - started)
    if isinstance(error, Exception) and not isinstance(error, LeaseLost):  # (LeaseLost: it never ran)
        ctx.events.incr("loader_errors")
    log.info("%s: a load that ran past its timeout raised %r; releasing the lock", ctx.keys.value, error)
    yield from _release(ctx)


def _release(ctx: Context) -> Flow:
    try:
        yield from ctx.leases.release()
    except BackendUnavailable:
        pass  # the lease runs out by itself


def _backend_failed(ctx: Context, error: BackendUnavailable, counted: bool = False) -> Flow:
    if not counted:
        _count_backend_error(ctx, error)
    if ctx.settings.on_backend_error == "raise":
        raise error
    return (yield from _load_uncached(ctx))


def _count_backend_error(ctx: Context, error: BaseException) -> None:
    note_backend_error(ctx.events, ctx.warn, error, ctx.keys.value)


def _corrupt(ctx: Context, problem: str) -> None:
    note_corrupt(ctx.events, ctx.warn, ctx.keys.value, problem)


def note_backend_error(events: Reporter, warn: WarningLog, error: BaseException, key: str = "") -> None:
    """Count a failed store command and warn, at most every few seconds."""
    events.incr("redis_errors")
    warn.warning(
        "stampede: cache backend failed (%s); serving without the cache", error, key=key, outcome="redis_error"
    )


def note_corrupt(events: Reporter, warn: WarningLog, key: str, problem: str) -> None:
    """Count an unreadable value and warn. The caller treats it as a miss."""
    events.incr("corrupt_values")
    warn.warning(
        "stampede: unreadable value at %r (%s); treating it as a miss", key, problem, key=key, outcome="corrupt_value"
    )


def _jittered(ctx: Context, ttl: float) -> float:
    jitter = ctx.settings.jitter
    return ttl * ctx.uniform(1.0 - jitter, 1.0 + jitter) if jitter else ttl
