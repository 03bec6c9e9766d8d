"""The ZooKeeper family's lease service: what ``zookeeper=`` composes beside a Redis
backend (``Backend.with_leases``). Every load's lease is also an ephemeral node, held
for its holder's session (``_core.sessions.SessionLeases``); named locks wait in
ZooKeeper's fair line beside the cache server's key (``locks``, ``alocks``)."""

from __future__ import annotations

import functools
from typing import Any

from ..._core.backend import LeaseService
from ..._core.sessions import SESSION_QUORUM, SessionLeases
from ..._errors import BackendUnavailable
from .alocks import AsyncZooKeeperLockStore
from .lines import Wakers
from .locks import ZooKeeperLockStore
from .servers import AsyncZooKeeperLockServers, ZooKeeperLockServers, ZooKeeperQueue, client_of

SESSION_TIMEOUT = 10.0  # kazoo's default: how long a silent holder keeps its leases
CONNECT_TIMEOUT = 10.0


def zookeeper_leases(zookeeper: Any) -> LeaseService:
    """The lease service over ``zookeeper``: hosts (``host:port[,host:port...]``), or a
    started kazoo client, which stays the caller's to stop. A client made here from hosts
    is stopped with the layer."""
    try:
        client, owned = client_of(zookeeper, SESSION_TIMEOUT, CONNECT_TIMEOUT)
    except Exception as error:
        raise BackendUnavailable(f"cannot connect to ZooKeeper at {zookeeper!r}: {error}") from error
    servers = ZooKeeperLockServers(client)
    queue, wakers = ZooKeeperQueue(servers), Wakers()

    def stop() -> None:
        client.stop()
        client.close()

    return LeaseService(
        "zookeeper",
        SessionLeases(SESSION_QUORUM),
        servers,
        functools.partial(AsyncZooKeeperLockServers, servers),
        named_lock_store=functools.partial(ZooKeeperLockStore, queue=queue, wakers=wakers),
        async_named_lock_store=functools.partial(AsyncZooKeeperLockStore, queue=queue, wakers=wakers),
        lock_queue=queue,  # ZooKeeper's line is fair
        close=stop if owned else None,
    )
