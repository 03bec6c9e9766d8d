"""A layer's store seen through its lease policy, for the store contract: each leased
method is the policy's decision (``_core.leases``), performed by the drivers' own loop
and performer on the store and the lock servers. The rest is the store's.

A layer never works this way: its flow composes the policy's steps. The contract's
promises (a lease taken once, a write refused after an invalidation, a hold that keeps
everyone out...) must hold whatever the policy, so the suite checks them through this
view on Redlock and ZooKeeper layers (``tests/promises/test_store_contract.py``)."""

# leased.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
from __future__ import annotations

from typing import Any, TypeVar

from stampede._core.effects import Decision, Lease
from stampede._core.keys import EntryKeys
from stampede._core.store import AcquireReply, Roles, Written, roles_of
from stampede._core.tags import Tagged
from stampede._drivers.aleases import AsyncLeases
from stampede._drivers.aperform import AsyncPerformer, arun

T = TypeVar("T")


class AsyncLeasedStore:
    """A store whose leased methods are its layer's policy's decisions."""

    def __init__(self, leases: AsyncLeases) -> None:
        self._leases = leases
        self.session_leases = getattr(leases.policy, "session_leases", False)
        # The leases are the policy's, not the store's: a budget grants slots without
        # them, and a load asks after its slot (as a layer's does: _drivers.abudget).
        self.optional_roles = roles_of(leases.store) & ~Roles.SLOT_LEASES

    async def _run(self, decision: Decision[T], lease: Lease) -> T:
        return await arun(decision, AsyncPerformer(lease, store=self._leases.store, servers=self._leases.servers))

    async def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"", clock: str = ""
    ) -> AcquireReply:
        decision = self._leases.policy.acquire(keys, token, lease_ms, check_value, stale)
        return await self._run(decision, Lease(keys, token, lease_ms, clock=clock))

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return await self._leases.renew(keys, token, lease_ms)

    async def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        decision = self._leases.policy.write_release(keys, token, envelope, ttl_ms, inline, tagged)
        return await self._run(decision, Lease(keys, token))

    async def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written:
        return await self._run(self._leases.policy.touch(keys, token, identity, ttl_ms), Lease(keys, token))

    async def release(self, keys: EntryKeys, token: str) -> bool:
        return await self._run(self._leases.policy.release(keys, token), Lease(keys, token))

    async def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        return await self._run(self._leases.policy.hold(keys, token, hold_ms, failing_ms), Lease(keys, token))

    async def invalidate(self, keys: EntryKeys) -> None:
        await self._leases.invalidate(keys)

    async def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        await self._run(self._leases.policy.seize(keys, token, lease_ms), Lease(keys, token, lease_ms))

    async def put(
        self, keys: EntryKeys, token: str, lease_ms: int, envelope: bytes, ttl_ms: int, inline: bool,
        tagged: Tagged | None = None,
    ) -> Written:  # fmt: skip
        lease = Lease(keys, token, lease_ms)
        return await self._run(self._leases.policy.bind(lease).put(envelope, ttl_ms, inline, tagged), lease)

    async def expire(self, keys: EntryKeys) -> None:
        await self._leases.expire(keys)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._leases.store, name)
