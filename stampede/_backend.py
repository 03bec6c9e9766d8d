"""The one place that chooses a layer's backend: from a URL's scheme, or from the
objects the layer was given.

``SCHEMES`` maps each URL scheme to its family. A new family is a folder under
``_backends/`` with a builder of ``Backend`` (``_core/backend.py``), plus one line here
(see docs/development.md). The layer's keywords (``client=``, ``async_client=``,
``postgres=``, ``redlock=``, ``zookeeper=``) are shorthand, translated here and nowhere
else. Redlock and ZooKeeper leases sit on top of the Redis family: each is a lease policy
of the core (``_core/leases.py``) and the lock servers it needs, composed here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ._backends.each import AsyncOneByOne as AsyncOneByOne  # stampede.backends shows them
from ._backends.each import OneByOne as OneByOne
from ._backends.redis.alock_servers import AsyncRedisLockServers
from ._backends.redis.lock_servers import RedisLockServers
from ._core.backend import DEFAULT_CONNECT_TIMEOUT, DEFAULT_SOCKET_TIMEOUT, Backend, BackendOptions
from ._core.store import Store
from ._errors import BackendUnavailable, ConfigError
from ._redact import redacted

if TYPE_CHECKING:
    from ._redlock import Redlock

DEFAULT_MAX_CONNECTIONS = 64
ZOOKEEPER_SESSION_TIMEOUT = 10.0  # kazoo's default: how long a silent holder keeps its leases
ZOOKEEPER_CONNECT_TIMEOUT = 10.0

SCHEMES: dict[str, str] = {
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
    "redis+sentinel": "redis",
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "memory": "memory",
}
"""URL scheme -> backend family."""


def family_of(url: str) -> str:
    """The family a URL names (``ConfigError`` for a scheme no family serves)."""
    scheme = urlsplit(url).scheme.lower()
    family = SCHEMES.get(scheme)
    if family is None:
        known = ", ".join(f"{name}://" for name in SCHEMES)
        raise ConfigError(f"bad URL {redacted(url)!r}: no backend serves {scheme!r}; a URL starts with one of {known}")
    return family


BackendBuilder = Callable[[BackendOptions], Backend]
"""What ``Stampede(backend=...)`` takes: a maker of the layer's backend, given the
layer's options (its namespace and settings, the breaker's report)."""


def memory_builder() -> BackendBuilder:
    """The embedded family: one store in this process's memory."""
    from ._backends.memory.backend import memory_backend

    return memory_backend


def redis_builder(client: Any = None, async_client: Any = None) -> BackendBuilder:
    """The Redis family (one server, Sentinel, Cluster, and Valkey too) over redis-py clients
    made by the application: ``client`` for blocking loaders, ``async_client`` (a client,
    or a maker of one per event loop) for async ones."""
    if client is None and async_client is None:
        raise ConfigError("a Redis backend needs a client, an async_client, or both")
    from ._backends.redis.backend import redis_backend

    return functools.partial(redis_backend, client, async_client)


def postgres_builder(pool: Any) -> BackendBuilder:
    """The PostgreSQL family over a psycopg_pool ``ConnectionPool`` (or a URL)."""
    return functools.partial(_postgres, pool)


def built_by(builder: BackendBuilder, options: BackendOptions) -> Backend:
    """The backend ``builder`` makes for a layer of ``options``, refused with a
    ``ConfigError`` unless it is one a layer can use."""
    if not callable(builder):
        raise ConfigError(f"backend= takes a maker of a Backend (see stampede.backends), got {builder!r}")
    backend = builder(options)
    if not isinstance(backend, Backend):
        raise ConfigError(f"backend= made {backend!r}, not a stampede.backends.Backend")
    if backend.store is None and backend.make_async_store is None:
        raise ConfigError(f"the backend {backend.name!r} has no store, blocking or asyncio")
    return backend


def backend_for(
    options: BackendOptions,
    *,
    client: Any = None,
    async_client: Any = None,
    postgres: Any = None,
    redlock: Redlock | None = None,
    zookeeper: Any = None,
    backend: BackendBuilder | None = None,
) -> Backend:
    """The backend the layer's keywords name (``Stampede(...)``)."""
    if backend is not None:
        if any(given is not None for given in (client, async_client, postgres, redlock, zookeeper)):
            raise ConfigError("backend= is the whole backend: pass no client, async_client, postgres, redlock "
                              "or zookeeper with it")  # fmt: skip
        return built_by(backend, options)
    if redlock is not None and client is None and async_client is None:
        raise ConfigError("redlock= needs a cache server: pass a redis client, or use Stampede.from_url")
    if zookeeper is not None and (redlock is not None or (client is None and async_client is None)):
        raise ConfigError("zookeeper= holds leases beside a cache server: pass a redis client, and no redlock")
    if postgres is not None:
        if client is not None or async_client is not None or redlock is not None:
            raise ConfigError("postgres= is the whole store: pass no redis client and no redlock with it")
        return _postgres(postgres, options)
    if client is None and async_client is None:
        from ._backends.memory.backend import memory_backend

        return memory_backend(options)
    from ._backends.redis.backend import redis_backend

    built = redis_backend(client, async_client, options)
    if redlock is not None:
        _with_redlock(built, redlock)
    if zookeeper is not None:
        _with_zookeeper(built, zookeeper)
    return built


def given_by_url(
    url: str,
    *,
    cluster: bool,
    socket_timeout: float,
    socket_connect_timeout: float,
    max_connections: int,
    lease_services: bool,
) -> tuple[dict[str, Any], Callable[[], None]]:
    """What ``Stampede.from_url(url)`` passes to ``Stampede(...)``, and how to close it.
    ``lease_services``: Redlock or ZooKeeper leases were asked for too (Redis's only)."""
    family = family_of(url)
    if family == "memory":
        if cluster or lease_services:
            raise ConfigError("a memory:// store is this process's: cluster=, redlock= and zookeeper= are Redis's")
        return {}, _nothing
    if family == "postgresql":
        if cluster or lease_services:
            raise ConfigError("a postgresql:// URL is the whole store: cluster= and redlock= are Redis's")
        pool = _postgres_pool(url, socket_timeout, socket_connect_timeout, max_connections)
        return {"postgres": pool}, pool.close
    from ._backends.redis.clients import close_client, make_clients

    client, make_async_client = make_clients(
        url,
        cluster=cluster,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
        max_connections=max_connections,
    )
    return {"client": client, "async_client": make_async_client}, functools.partial(close_client, client)


def _nothing() -> None:
    pass


def _postgres(postgres: Any, options: BackendOptions) -> Backend:
    """``postgres=``: a psycopg_pool ``ConnectionPool``, or a ``postgresql://`` URL for a
    pool with the default bounds, which the store owns."""
    if isinstance(postgres, str):
        if family_of(postgres) != "postgresql":
            raise ConfigError(
                f"postgres= takes a postgresql:// URL or a psycopg_pool.ConnectionPool, got {redacted(postgres)!r}"
            )
        pool = _postgres_pool(postgres, DEFAULT_SOCKET_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_CONNECTIONS)
        owns_pool = True
    else:
        pool, owns_pool = postgres, False
    try:
        from ._backends.postgres.backend import postgres_backend
    except ImportError as error:
        needs = "postgres= needs psycopg 3 and psycopg-pool: pip install 'stampede-guard[postgres]'"
        raise ConfigError(f"{needs} ({error})") from None
    try:
        return postgres_backend(pool, options, owns_pool=owns_pool)
    except BaseException:
        if owns_pool:  # a setting refused: nothing left open
            pool.close()
        raise


def _postgres_pool(url: str, socket_timeout: float, connect_timeout: float, max_connections: int) -> Any:
    """A bounded pool for ``url`` (``_backends.postgres.pools.make_pool``). The
    ``postgres`` extra's psycopg is imported here only."""
    try:
        from ._backends.postgres.backend import make_pool
    except ImportError as error:
        needs = "a postgresql:// store needs psycopg 3 and psycopg-pool: pip install 'stampede-guard[postgres]'"
        raise ConfigError(f"{needs} ({error})") from None
    return make_pool(
        url, socket_timeout=socket_timeout, connect_timeout=connect_timeout, max_connections=max_connections
    )


def _with_redlock(backend: Backend, redlock: Redlock) -> None:
    """Every load's lease is held on a majority of ``redlock``'s servers as well as on the
    cache server (``_core.majority.RedlockLeases``). Named locks stay on the cache server
    (a fencing token and a fair queue need one server)."""
    from ._core.majority import RedlockLeases

    backend.name += "+redlock"
    backend.lease_policy = RedlockLeases(redlock.quorum)
    backend.lock_servers = redlock.servers  # its clients are the Redlock manager's: it closes them
    if backend.make_async_store is not None:
        backend.make_async_lock_servers = redlock.async_servers  # its ConfigError before any client is made


def _with_zookeeper(backend: Backend, zookeeper: Any) -> None:
    """Every load's lease is also a ZooKeeper node (``zookeeper=``: hosts,
    ``host:port[,host:port...]``, or a started kazoo client), held for its holder's
    session (``_core.sessions.SessionLeases``). Named locks wait in ZooKeeper's fair line
    beside the cache server's key (``_backends.zookeeper.locks``)."""
    try:
        from ._backends.zookeeper.servers import (
            AsyncZooKeeperLockServers,
            ZooKeeperLockServers,
            ZooKeeperQueue,
            client_of,
        )
    except ImportError as error:
        raise ConfigError(f"zookeeper= needs kazoo: pip install 'stampede-guard[zookeeper]' ({error})") from None
    from ._backends.zookeeper.alocks import AsyncZooKeeperLockStore
    from ._backends.zookeeper.lines import Wakers
    from ._backends.zookeeper.locks import ZooKeeperLockStore
    from ._core.sessions import SESSION_QUORUM, SessionLeases

    try:
        client, owned = client_of(zookeeper, ZOOKEEPER_SESSION_TIMEOUT, ZOOKEEPER_CONNECT_TIMEOUT)
    except Exception as error:
        raise BackendUnavailable(f"cannot connect to ZooKeeper at {zookeeper!r}: {error}") from error
    servers = ZooKeeperLockServers(client)
    backend.name += "+zookeeper"
    backend.lease_policy = SessionLeases(SESSION_QUORUM)
    backend.lock_servers = servers
    if backend.make_async_store is not None:
        backend.make_async_lock_servers = functools.partial(AsyncZooKeeperLockServers, servers)
    queue, wakers = ZooKeeperQueue(servers), Wakers()
    backend.named_lock_store = functools.partial(ZooKeeperLockStore, queue=queue, wakers=wakers)
    backend.async_named_lock_store = functools.partial(AsyncZooKeeperLockStore, queue=queue, wakers=wakers)
    backend.lock_queue = queue  # ZooKeeper's line is fair
    if owned:

        def stop() -> None:
            client.stop()
            client.close()

        backend.close_first.append(stop)


__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_SOCKET_TIMEOUT",
    "SCHEMES",
    "AsyncRedisLockServers",  # Redlock's servers (``stampede.Redlock``)
    "Backend",
    "BackendOptions",
    "RedisLockServers",
    "Store",
    "backend_for",
    "family_of",
    "given_by_url",
]
