"""A layer's lease policy (``_core.leases``) performed outside a flow: the watchdog's
renewals, and the layer's invalidations and expires. Each is the policy's decision,
driven by ``perform.run`` or ``perform.arun`` as a flow is. On a Redlock layer an
invalidation drops the majority first, so a waiter takes over at once."""

from __future__ import annotations

from .._core.effects import Lease
from .._core.keys import EntryKeys
from .._core.leases import LeasePolicy
from .._core.store import AsyncLockServers, AsyncStore, LockServers, Store
from .perform import AsyncPerformer, Performer, arun, run


class Leases:
    """The policy's steps on a blocking store (and lock servers, if it has them). A
    ``Renewable``, for the watchdog."""

    def __init__(self, policy: LeasePolicy, store: Store, servers: LockServers | None = None) -> None:
        self.policy = policy
        self.store = store
        self.servers = servers

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return run(self.policy.renew(keys, token, lease_ms), self._performer(Lease(keys, token)))

    def invalidate(self, keys: EntryKeys) -> None:
        run(self.policy.invalidate(keys), self._performer(Lease(keys)))

    def expire(self, keys: EntryKeys) -> None:
        run(self.policy.expire(keys), self._performer(Lease(keys)))

    def _performer(self, lease: Lease) -> Performer:
        return Performer(lease, store=self.store, servers=self.servers)


class AsyncLeases:
    """``Leases`` for the tasks of one event loop."""

    def __init__(self, policy: LeasePolicy, store: AsyncStore, servers: AsyncLockServers | None = None) -> None:
        self.policy = policy
        self.store = store
        self.servers = servers

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return await arun(self.policy.renew(keys, token, lease_ms), self._performer(Lease(keys, token)))

    async def invalidate(self, keys: EntryKeys) -> None:
        await arun(self.policy.invalidate(keys), self._performer(Lease(keys)))

    async def expire(self, keys: EntryKeys) -> None:
        await arun(self.policy.expire(keys), self._performer(Lease(keys)))

    def _performer(self, lease: Lease) -> AsyncPerformer:
        return AsyncPerformer(lease, store=self.store, servers=self.servers)
