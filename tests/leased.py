# Generated from aleased.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""A layer's store seen through its lease policy, for the store contract: each leased
method is the policy's decision (``_core.leases``), performed by the drivers' own loop
and performer on the store and the lock servers. The rest is the store's.

A layer never works this way: its flow composes the policy's steps. The contract's
promises (a lease taken once, a write refused after an invalidation, a hold that keeps
everyone out...) must hold whatever the policy, so the suite checks them through this
view on Redlock and ZooKeeper layers (``tests/promises/test_store_contract.py``)."""

from __future__ import annotations

from typing import Any, TypeVar

from stampede._core.effects import Decision, Lease
from stampede._core.keys import EntryKeys
from stampede._core.store import AcquireReply, Roles, Written, roles_of
from stampede._core.tags import Tagged
from stampede._drivers.leases import Leases
from stampede._drivers.perform import Performer, run

T = TypeVar("T")


class LeasedStore:
    """A store whose leased methods are its layer's policy's decisions."""

    def __init__(self, leases: Leases) -> None:
        self._leases = leases
        self.session_leases = getattr(leases.policy, "session_leases", False)
        # The leases are the policy's, not the store's: a budget grants slots without
        # them, and a load asks after its slot (as a layer's does: _drivers.budget).
        self.optional_roles = roles_of(leases.store) & ~Roles.SLOT_LEASES

    def _run(self, decision: Decision[T], lease: Lease) -> T:
        return run(decision, Performer(lease, store=self._leases.store, servers=self._leases.servers))

    def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"", clock: str = ""
    ) -> AcquireReply:
        decision = self._leases.policy.acquire(keys, token, lease_ms, check_value, stale)
        return self._run(decision, Lease(keys, token, lease_ms, clock=clock))

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return self._leases.renew(keys, token, lease_ms)

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        decision = self._leases.policy.write_release(keys, token, envelope, ttl_ms, inline, tagged)
        return self._run(decision, Lease(keys, token))

    def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written:
        return self._run(self._leases.policy.touch(keys, token, identity, ttl_ms), Lease(keys, token))

    def release(self, keys: EntryKeys, token: str) -> bool:
        return self._run(self._leases.policy.release(keys, token), Lease(keys, token))

    def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        return self._run(self._leases.policy.hold(keys, token, hold_ms, failing_ms), Lease(keys, token))

    def invalidate(self, keys: EntryKeys) -> None:
        self._leases.invalidate(keys)

    def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        self._run(self._leases.policy.seize(keys, token, lease_ms), Lease(keys, token, lease_ms))

    def put(
        self, keys: EntryKeys, token: str, lease_ms: int, envelope: bytes, ttl_ms: int, inline: bool,
        tagged: Tagged | None = None,
    ) -> Written:  # fmt: skip
        lease = Lease(keys, token, lease_ms)
        return self._run(self._leases.policy.bind(lease).put(envelope, ttl_ms, inline, tagged), lease)

    def expire(self, keys: EntryKeys) -> None:
        self._leases.expire(keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._leases.store, name)
