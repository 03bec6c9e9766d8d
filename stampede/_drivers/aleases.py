"""A layer's lease policy (``_core.leases``) performed outside a flow: the lease's
renewals, and the layer's invalidations and expires. Each is the policy's decision,
driven as a flow is. On a Redlock layer an invalidation drops the majority first, so a
waiter takes over at once."""

# leases.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
from __future__ import annotations

from .._core.effects import Lease
from .._core.keys import EntryKeys
from .._core.leases import ONE_SERVER, LeasePolicy
from .._core.store import AsyncLockServers, AsyncStore
from .aperform import AsyncPerformer, arun


class AsyncLeases:
    """The policy's steps on a store (and lock servers, if it has them). A renewable
    lease holder (``Renewable``), for the renewals while a load runs."""

    def __init__(self, policy: LeasePolicy, store: AsyncStore, servers: AsyncLockServers | None = None) -> None:
        self.policy = policy
        self.store = store
        self.servers = servers
        # The store that alone holds these leases (a budget's store may check them as it
        # grants a slot: SlotLeaseStore), or None where lock servers hold them.
        self.home: AsyncStore | None = store if policy is ONE_SERVER else None

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return await arun(self.policy.renew(keys, token, lease_ms), self._performer(Lease(keys, token)))

    async def invalidate(self, keys: EntryKeys) -> None:
        await arun(self.policy.invalidate(keys), self._performer(Lease(keys)))

    async def expire(self, keys: EntryKeys) -> None:
        await arun(self.policy.expire(keys), self._performer(Lease(keys)))

    def _performer(self, lease: Lease) -> AsyncPerformer:
        return AsyncPerformer(lease, store=self.store, servers=self.servers)
