"""Redlock's decisions, written once (sans-IO): the arithmetic of a majority, taking and
renewing a lease on most of N servers, and a layer's leases held on lock servers and on
the cache server together (``RedlockLeases``, a lease policy: ``_core.leases``). The flow
composes the policy's steps, and ``_redlock`` takes its locks with the same arithmetic.
``_drivers.perform`` performs them. The tests step through them without a server.

The algorithm is ``_redlock``'s (see there). The order of the steps of a layer's leases
is what keeps waiters from missing a wake-up:

* take: the majority first, then the cache key with the value's double-check. A refused
  majority is followed by a read of the value, because a holder writes (and wakes its
  waiters) before it releases the majority; the read also tells whether the entry's
  loader is failing (a failed load's hold lives on the cache server, where a caller
  refused by the majority cannot see it), so that a caller with a stale value serves it
  at once rather than wait for a message that a lease taken only to find the hold (a
  background refresh's) does not send.
* write: on the cache server (waking the waiters with the value), then release the
  majority. Release without a write: the majority first, then the cache key, whose
  message wakes the waiters to take it.
* invalidate: drop the majority first, then the value and the cache key, whose message
  wakes the waiters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .._errors import BackendUnavailable
from .effects import (
    Acquire,
    Decision,
    Effect,
    Expire,
    Hold,
    Invalidate,
    Lease,
    ReadEntry,
    Release,
    Renew,
    Seize,
    ServersDrop,
    ServersRelease,
    ServersRenew,
    ServersTake,
    Subscribe,
    Touch,
    WriteRelease,
)
from .keys import EntryKeys
from .leases import BoundSteps, LeaseSteps
from .store import AcquireReply, LockState, Round, Written
from .tags import Tagged

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Quorum:
    """The arithmetic of a majority of ``size`` servers."""

    size: int
    clock_drift_factor: float

    @property
    def needed(self) -> int:
        return self.size // 2 + 1

    def valid_until(self, started: float, ttl: float) -> float:
        """When a lease of ``ttl`` seconds asked for at ``started`` stops being safe."""
        return started + ttl - (ttl * self.clock_drift_factor + 0.002)

    def holds(self, answered: Round, valid_until: float, now: float) -> bool:
        return answered.agreed >= self.needed and now < valid_until

    def reachable(self, answered: Round) -> bool:
        """Whether enough servers answered for a majority to be possible at all."""
        return self.size - answered.failed >= self.needed


def take_majority(
    quorum: Quorum,
    keys: EntryKeys,
    token: str,
    lease_ms: int,
    clock: Callable[[], float] = time.monotonic,
) -> Decision[tuple[Round, float | None]]:
    """Take a lease on every server. Returns the answers and, if a majority granted it in
    time, the end of its validity. Else None, with what was granted undone."""
    started = clock()
    try:
        taken: Round = yield ServersTake(keys, token, lease_ms)
    except GeneratorExit:
        raise
    except BaseException:
        yield ServersRelease(keys, token)  # interrupted: some may have granted it
        raise
    valid_until = quorum.valid_until(started, lease_ms / 1000)
    if quorum.holds(taken, valid_until, clock()):
        return taken, valid_until
    if taken.agreed:
        yield ServersRelease(keys, token)  # undo a minority (or a late majority)
    return taken, None


def renew_majority(
    quorum: Quorum,
    keys: EntryKeys,
    token: str,
    lease_ms: int,
    clock: Callable[[], float] = time.monotonic,
) -> Decision[tuple[Round, float | None]]:
    """Reset a lease to ``lease_ms`` on every server. Returns the answers and, if a
    majority renewed it in time, the new end of its validity. Else None."""
    started = clock()
    renewed: Round = yield ServersRenew(keys, token, lease_ms)
    valid_until = quorum.valid_until(started, lease_ms / 1000)
    return renewed, valid_until if quorum.holds(renewed, valid_until, clock()) else None


def releasing_after(decision: Decision[T], keys: EntryKeys, token: str) -> Decision[T]:
    """``decision``, then the majority released, whether it returned or raised.

    Not a bare ``finally``: a generator closed at its ``yield`` (GeneratorExit) may yield
    nothing more. Then the servers' leases end by their term (or session) instead."""
    try:
        result = yield from decision
    except GeneratorExit:
        raise
    except BaseException:
        yield ServersRelease(keys.on_lock_servers, token)
        raise
    yield ServersRelease(keys.on_lock_servers, token)
    return result


def one(effect: Effect) -> Decision[Any]:
    """A decision of one effect, whose reply it returns."""
    reply = yield effect
    return reply


class RedlockLeases:
    """The decisions of a store whose leases are Redlock leases: lease commands go to
    the cache server (for the performer's lease), lock-server commands to the majority,
    on the entry's ``on_lock_servers`` keys."""

    def __init__(self, quorum: Quorum, clock: Callable[[], float] = time.monotonic) -> None:
        self.quorum = quorum
        self.clock = clock

    def bind(self, lease: Lease) -> LeaseSteps:
        return BoundSteps(self, lease)

    def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b""
    ) -> Decision[AcquireReply]:
        quorum, on_servers = self.quorum, keys.on_lock_servers
        taken, valid_until = yield from take_majority(quorum, on_servers, token, lease_ms, self.clock)
        if valid_until is not None:
            try:
                reply: AcquireReply = yield Acquire(check_value, stale)
            except GeneratorExit:
                raise
            except BaseException:
                yield ServersRelease(on_servers, token)
                raise
            if reply.state is not LockState.LOCKED:  # the value is there, or a lapsed holder's key
                yield ServersRelease(on_servers, token)
            return reply
        return (yield from self.refused(keys, taken, check_value, stale))

    def refused(self, keys: EntryKeys, taken: Round, check_value: bool, stale: bytes) -> Decision[AcquireReply]:
        """After the lock servers refused a lease: unavailable (too few answered), the
        value (a holder writes before it releases the servers), or held; held ``failed``
        while the entry is marked failing, as the cache server's hold would say."""
        quorum = self.quorum
        if not quorum.reachable(taken):
            raise BackendUnavailable(
                f"only {quorum.size - taken.failed} of {quorum.size} lock servers answered for {keys.value!r}; "
                f"a lease needs {quorum.needed}",
                key=keys.value,
            )
        if not (check_value or stale):
            return AcquireReply(LockState.HELD, lease_left=taken.lease_left)
        raw, ttl_left, failing = yield ReadEntry()
        if check_value and raw is not None and not (stale and raw.startswith(stale)):
            return AcquireReply(LockState.VALUE, raw, ttl_left=ttl_left)
        return AcquireReply(LockState.HELD, lease_left=taken.lease_left, failed=failing)

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Decision[bool]:
        """Renewed while a majority renews in time. The cache key is renewed too, best
        effort: without it the write is refused, but the majority keeps other loads out
        until this one ends."""
        quorum, on_servers = self.quorum, keys.on_lock_servers
        renewed, valid_until = yield from renew_majority(quorum, on_servers, token, lease_ms, self.clock)
        if valid_until is None:
            if not quorum.reachable(renewed):
                raise BackendUnavailable(
                    f"only {quorum.size - renewed.failed} of {quorum.size} lock servers answered "
                    f"to renew the lease of {keys.value!r}",
                    key=keys.value,
                )
            return False
        try:
            yield Renew(lease_ms)
        except BackendUnavailable:
            pass
        return True

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Decision[Written]:
        written: Written = yield from releasing_after(one(WriteRelease(envelope, ttl_ms, inline, tagged)), keys, token)
        return written

    def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Decision[Written]:
        kept: Written = yield from releasing_after(one(Touch(identity, ttl_ms)), keys, token)
        return kept

    def release(self, keys: EntryKeys, token: str) -> Decision[bool]:
        yield ServersRelease(keys.on_lock_servers, token)
        released: bool = yield Release()
        return released

    def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> Decision[bool]:
        """The hold lives on the cache server, where every take ends (a lease on the lock
        servers alone is not enough to load). The majority is released first."""
        yield ServersRelease(keys.on_lock_servers, token)
        held: bool = yield Hold(hold_ms, failing_ms)
        return held

    def invalidate(self, keys: EntryKeys) -> Decision[None]:
        yield ServersDrop(keys.on_lock_servers)
        yield Invalidate()

    def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> Decision[bool]:
        """Drop the majority, take it for ``token``, then invalidate and take the cache
        key. A load that took the majority in between wins: the entry is invalidated."""
        on_servers = keys.on_lock_servers
        yield ServersDrop(on_servers)
        taken, valid_until = yield from take_majority(self.quorum, on_servers, token, lease_ms, self.clock)
        if valid_until is None:
            yield from self.refused(keys, taken, False, b"")  # raises if too few servers answered
            yield Invalidate()
            return False
        try:
            yield Seize()
        except GeneratorExit:
            raise
        except BaseException:
            yield ServersRelease(on_servers, token)
            raise
        return True

    def expire(self, keys: EntryKeys) -> Decision[None]:
        yield ServersDrop(keys.on_lock_servers)
        yield Expire()

    def subscribe(self, keys: EntryKeys) -> Decision[None]:
        """Waiters hear of the holder's write or release on the cache server, which every
        holder ends with."""
        yield Subscribe()
