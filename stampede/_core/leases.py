"""Lease policies (sans-IO): where a load's lease is held, step by step.

A lease is taken, renewed, written under and released, held after a failed load,
dropped by an invalidation or an expire, and waited on. Each of these steps is a
decision of the layer's policy:

* ``OneServer``: on the cache server alone. Each step is one effect.
* ``RedlockLeases`` (``_core.majority``): on a majority of independent lock servers as
  well, so that no two loads of a key run at once even when the cache server loses its
  keys.
* ``SessionLeases`` (``_core.sessions``): as a ZooKeeper node as well, which ends with
  its holder's session.

The flow composes the steps with ``yield from`` (``ctx.leases``: the policy bound to
the load's lease), and the watchdog and the layer's invalidations perform the policy's
``renew``, ``invalidate`` and ``expire``. So one loop (``_drivers.perform``) drives one
call, whatever the policy, and a store does only what one server does (``_core.store``).
Cleanup after an interruption is written once, in the policy's decision.
"""

from __future__ import annotations

from typing import Protocol

from .._errors import BackendUnavailable
from .effects import (
    Acquire,
    Decision,
    Expire,
    Hold,
    Invalidate,
    Lease,
    Put,
    Release,
    Renew,
    Seize,
    Subscribe,
    Touch,
    WriteRelease,
)
from .keys import EntryKeys
from .store import AcquireReply, Written
from .tags import Tagged


class LeasePolicy(Protocol):
    """How a layer holds a load's lease: each step a decision. Lease commands
    (``Acquire``, ``WriteRelease``...) go to the cache server for the performer's lease.
    Lock-server commands name ``keys.on_lock_servers`` and ``token`` themselves."""

    def bind(self, lease: Lease) -> LeaseSteps:
        """The steps of one load's ``lease``, as the flow takes them."""
        ...

    def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b""
    ) -> Decision[AcquireReply]: ...

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Decision[bool]: ...

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Decision[Written]: ...

    def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Decision[Written]: ...

    def release(self, keys: EntryKeys, token: str) -> Decision[bool]: ...

    def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> Decision[bool]: ...

    def invalidate(self, keys: EntryKeys) -> Decision[None]: ...

    def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> Decision[bool]:
        """Invalidate the entry and take its lease for ``token`` (a write-through's first
        step), or only invalidate it and return False if a load began in between."""
        ...

    def expire(self, keys: EntryKeys) -> Decision[None]: ...

    def subscribe(self, keys: EntryKeys) -> Decision[None]: ...


class LeaseSteps(Protocol):
    """A policy bound to one load's lease: the steps the flow takes (``ctx.leases``)."""

    def acquire(self, check_value: bool, stale: bytes = b"") -> Decision[AcquireReply]: ...

    def write_release(
        self, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Decision[Written]: ...

    def touch(self, identity: bytes, ttl_ms: int) -> Decision[Written]: ...

    def release(self) -> Decision[bool]: ...

    def hold(self, hold_ms: int, failing_ms: int) -> Decision[bool]: ...

    def subscribe(self) -> Decision[None]: ...

    def put(self, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None) -> Decision[Written]:
        """A write-through (``set``): the entry's value and any holder's lease go, and
        ``envelope`` is written under the lease taken for it; ``REFUSED`` if a load that
        began after this set's invalidation holds the lease (or a tag refuses it)."""
        ...


class OneServerSteps:
    """``OneServer``'s steps: one effect each. Its effects carry no key and no token (the
    performer's lease has them), so one instance serves every load."""

    __slots__ = ()

    def acquire(self, check_value: bool, stale: bytes = b"") -> Decision[AcquireReply]:
        reply: AcquireReply = yield Acquire(check_value, stale)
        return reply

    def write_release(
        self, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Decision[Written]:
        written: Written = yield WriteRelease(envelope, ttl_ms, inline, tagged)
        return written

    def touch(self, identity: bytes, ttl_ms: int) -> Decision[Written]:
        kept: Written = yield Touch(identity, ttl_ms)
        return kept

    def release(self) -> Decision[bool]:
        released: bool = yield Release()
        return released

    def hold(self, hold_ms: int, failing_ms: int) -> Decision[bool]:
        held: bool = yield Hold(hold_ms, failing_ms)
        return held

    def subscribe(self) -> Decision[None]:
        yield Subscribe()

    def seize(self) -> Decision[bool]:
        yield Seize()
        return True

    def put(self, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None) -> Decision[Written]:
        written: Written = yield Put(envelope, ttl_ms, inline, tagged)  # one step: no lease left to clean up
        return written


ON_ONE_SERVER = OneServerSteps()


class OneServer:
    """The lease on the cache server alone: each step is one effect."""

    def bind(self, lease: Lease) -> LeaseSteps:
        return ON_ONE_SERVER

    def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b""
    ) -> Decision[AcquireReply]:
        return ON_ONE_SERVER.acquire(check_value, stale)

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Decision[bool]:
        renewed: bool = yield Renew(lease_ms)
        return renewed

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Decision[Written]:
        return ON_ONE_SERVER.write_release(envelope, ttl_ms, inline, tagged)

    def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Decision[Written]:
        return ON_ONE_SERVER.touch(identity, ttl_ms)

    def release(self, keys: EntryKeys, token: str) -> Decision[bool]:
        return ON_ONE_SERVER.release()

    def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> Decision[bool]:
        return ON_ONE_SERVER.hold(hold_ms, failing_ms)

    def invalidate(self, keys: EntryKeys) -> Decision[None]:
        yield Invalidate()

    def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> Decision[bool]:
        return ON_ONE_SERVER.seize()

    def expire(self, keys: EntryKeys) -> Decision[None]:
        yield Expire()

    def subscribe(self, keys: EntryKeys) -> Decision[None]:
        return ON_ONE_SERVER.subscribe()


ONE_SERVER = OneServer()


class BoundSteps:
    """A policy's steps for one load's lease (``LeasePolicy.bind``)."""

    __slots__ = ("_lease", "_policy")

    def __init__(self, policy: LeasePolicy, lease: Lease) -> None:
        self._policy = policy
        self._lease = lease

    def acquire(self, check_value: bool, stale: bytes = b"") -> Decision[AcquireReply]:
        lease = self._lease
        return self._policy.acquire(lease.keys, lease.token, lease.ms, check_value, stale)

    def write_release(
        self, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Decision[Written]:
        return self._policy.write_release(self._lease.keys, self._lease.token, envelope, ttl_ms, inline, tagged)

    def touch(self, identity: bytes, ttl_ms: int) -> Decision[Written]:
        return self._policy.touch(self._lease.keys, self._lease.token, identity, ttl_ms)

    def release(self) -> Decision[bool]:
        return self._policy.release(self._lease.keys, self._lease.token)

    def hold(self, hold_ms: int, failing_ms: int) -> Decision[bool]:
        return self._policy.hold(self._lease.keys, self._lease.token, hold_ms, failing_ms)

    def subscribe(self) -> Decision[None]:
        return self._policy.subscribe(self._lease.keys)

    def put(self, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None) -> Decision[Written]:
        """The policy's seizure, then its write under the lease seized; the lease released
        if either is interrupted or fails (the write may not have run)."""
        lease = self._lease
        try:
            if not (yield from self._policy.seize(lease.keys, lease.token, lease.ms)):
                return Written.REFUSED  # a load began after the seizure's invalidation
            written: Written = yield from self._policy.write_release(
                lease.keys, lease.token, envelope, ttl_ms, inline, tagged
            )
            return written
        except GeneratorExit:
            raise
        except BaseException:
            try:
                yield from self._policy.release(lease.keys, lease.token)
            except BackendUnavailable:
                pass  # the lease runs out by itself
            raise
