"""Backends: what ``Stampede(backend=...)`` takes, the families stampede ships, and what a
backend of your own provides.

A backend is made per layer by a builder, given the layer's ``BackendOptions`` (its
namespace, its settings, the report of its circuit breaker)::

    from stampede import Stampede, backends

    layer = Stampede(backend=backends.redis(client, async_client=make_async_client))

A backend outside stampede is a ``Backend`` whose ``store`` implements ``Store`` (and
``make_async_store`` makes an ``AsyncStore`` per event loop): leases with a token and an
expiry, writes only under the writer's lease, waiters woken, named locks. ``Store`` is
the sum of its roles (``EntryStore``, ``ControlStore``, ``ManyKeyStore``, ``TagStore``, ``NamedLockStore``,
``BudgetStore``, ``HotSetStore``, ``StoreAdmin``). The last two are optional: a store
declares the ones it has in ``optional_roles`` (``Roles.BUDGETS | Roles.HOT_SETS``); one
without ``Roles.BUDGETS`` serves every loader but those with ``max_concurrent_loads``,
and one without ``Roles.HOT_SETS`` every loader but those with ``hot_sample``, which it
refuses at decoration. A budget store whose entries' leases live beside its slots may
also declare ``Roles.SLOT_LEASES`` (``SlotLeaseStore``): a budgeted load then learns with its slot that its lease still
holds, instead of asking after. A store that declares ``Roles.STREAMS`` (``StreamStore``:
a run's relay, appended and read in order) serves ``cached_stream``, which a store
without it refuses at decoration. A store
may take the many-key role from ``OneByOne``, which sends one single-entry command per
entry. A backend written once, blocking, serves ``async def`` loaders too through
``ThreadedAsyncStore`` (``make_async_store=lambda: ThreadedAsyncStore(store)``: each
command in a worker thread, the event loop never blocked). It must pass
the contract suite unchanged (``stampede.testing.contract``, docs/development.md), which
runs over a layer built with ``Stampede(backend=your_builder)``. A backend may also wrap
one of the shipped ones: build it, then replace its stores.

``register_scheme("mystore", opener)`` lets ``Stampede.from_url("mystore://...")`` open
it: the opener makes the connections the URL names, within the ``Connections`` bounds
``from_url`` was given, and returns an ``Opened`` (the builder, and a close). A lease
service (``LeaseService``: Redlock's majority, ZooKeeper's sessions) is composed onto a
built backend into a new one with ``Backend.with_leases``, never by rewriting it.
"""

from __future__ import annotations

from ._backend import (
    AsyncOneByOne,
    BackendBuilder,
    Connections,
    OneByOne,
    Opened,
    Opener,
    ThreadedAsyncStore,
    register_scheme,
)
from ._backend import memory_builder as memory
from ._backend import postgres_builder as postgres
from ._backend import redis_builder as redis
from ._core.backend import Backend, BackendOptions, Inspector, LeaseService
from ._core.store import (
    TRACE_MARK,
    AcquireCall,
    AcquireReply,
    AsyncBudgetStore,
    AsyncControlStore,
    AsyncEntryStore,
    AsyncHotSetStore,
    AsyncManyKeyStore,
    AsyncNamedLockStore,
    AsyncSlotLeaseStore,
    AsyncStore,
    AsyncStoreAdmin,
    AsyncStreamStore,
    AsyncSubscription,
    AsyncTagStore,
    BudgetStore,
    ControlStore,
    EntryStore,
    HotSetStore,
    LockState,
    ManyKeyStore,
    NamedLockStore,
    Roles,
    SlotLeaseStore,
    Store,
    StoreAdmin,
    StreamStore,
    Subscription,
    TagStore,
    WriteCall,
    Written,
    roles_of,
)

__all__ = [
    "Backend",
    "BackendBuilder",
    "BackendOptions",
    "Inspector",
    "LeaseService",
    "Connections",
    "Opened",
    "Opener",
    "register_scheme",
    "memory",
    "redis",
    "postgres",
    # what a store implements, role by role, and the replies it gives
    "Store",
    "EntryStore",
    "ControlStore",
    "ManyKeyStore",
    "TagStore",
    "NamedLockStore",
    "BudgetStore",
    "SlotLeaseStore",
    "HotSetStore",
    "StreamStore",
    "StoreAdmin",
    "Roles",
    "roles_of",
    "OneByOne",
    "AsyncStore",
    "AsyncEntryStore",
    "AsyncControlStore",
    "AsyncManyKeyStore",
    "AsyncTagStore",
    "AsyncNamedLockStore",
    "AsyncBudgetStore",
    "AsyncSlotLeaseStore",
    "AsyncHotSetStore",
    "AsyncStreamStore",
    "AsyncStoreAdmin",
    "AsyncOneByOne",
    "ThreadedAsyncStore",
    "Subscription",
    "AsyncSubscription",
    "AcquireCall",
    "AcquireReply",
    "TRACE_MARK",
    "WriteCall",
    "Written",
    "LockState",
]
