"""The one place that chooses a layer's backend: from a URL's scheme, or from the
objects the layer was given.

``SCHEMES`` maps each URL scheme to its opener, which makes the connections the URL
names and returns the builder of a backend over them; ``register_scheme`` adds one from
outside the package (``stampede.backends``). A new family inside is a folder under
``_backends/`` with a builder of ``Backend`` (``_core/backend.py``), a builder here and
an opener in ``SCHEMES`` (docs/development.md). The layer's keywords (``client=``,
``async_client=``, ``postgres=``, ``redlock=``, ``zookeeper=``) are shorthand, translated
here and nowhere else. Redlock and ZooKeeper leases sit beside the Redis family: each is
a lease service (a policy of the core, ``_core/leases.py``, and the lock servers it
needs), composed onto a built backend into a new one (``Backend.with_leases``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ._backends.aeach import AsyncOneByOne as AsyncOneByOne  # stampede.backends shows them
from ._backends.each import OneByOne as OneByOne
from ._backends.mailbox import LoopMailbox as LoopMailbox  # the simulator's (stampede.testing.simulation)
from ._backends.memory.store import AsyncMemoryStore as AsyncMemoryStore
from ._backends.memory.store import MemoryStore as MemoryStore
from ._backends.redis.alock_servers import AsyncRedisLockServers
from ._backends.redis.lock_servers import RedisLockServers
from ._backends.threaded import ThreadedAsyncStore as ThreadedAsyncStore
from ._core.backend import DEFAULT_CONNECT_TIMEOUT, DEFAULT_SOCKET_TIMEOUT, Backend, BackendOptions, LeaseService
from ._core.store import Store
from ._errors import ConfigError
from ._redact import redacted

if TYPE_CHECKING:
    from ._redlock import Redlock

DEFAULT_MAX_CONNECTIONS = 64

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


@dataclass(frozen=True)
class Connections:
    """What ``Stampede.from_url`` asks of the connections a URL names: an opener's bounds."""

    socket_timeout: float = DEFAULT_SOCKET_TIMEOUT
    socket_connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    cluster: bool = False  # the URL names one node of a Redis Cluster


@dataclass(frozen=True)
class Opened:
    """What an opener made of a URL: the builder of the layer's backend, and how to close
    the connections it opened for it (after the layer's stores are closed)."""

    builder: BackendBuilder
    close: Callable[[], None]


Opener = Callable[[str, Connections], Opened]
"""What opens a URL of one scheme (``SCHEMES``, ``register_scheme``)."""


def _open_redis(url: str, connections: Connections) -> Opened:
    """redis://, rediss://, unix://, redis+sentinel:// (``_backends.redis.clients``)."""
    from ._backends.redis.clients import close_client, make_clients

    client, make_async_client = make_clients(
        url,
        cluster=connections.cluster,
        socket_timeout=connections.socket_timeout,
        socket_connect_timeout=connections.socket_connect_timeout,
        max_connections=connections.max_connections,
    )
    return Opened(redis_builder(client, make_async_client), functools.partial(close_client, client))


def _open_postgres(url: str, connections: Connections) -> Opened:
    if connections.cluster:
        raise ConfigError("cluster= is Redis's: a postgresql:// URL is the whole store")
    pool = _postgres_pool(
        url, connections.socket_timeout, connections.socket_connect_timeout, connections.max_connections
    )
    return Opened(postgres_builder(pool), pool.close)


def _open_memory(url: str, connections: Connections) -> Opened:
    if connections.cluster:
        raise ConfigError("cluster= is Redis's: a memory:// store is this process's")
    return Opened(memory_builder(), _nothing)


SCHEMES: dict[str, Opener] = {
    "redis": _open_redis,
    "rediss": _open_redis,
    "unix": _open_redis,
    "redis+sentinel": _open_redis,
    "postgresql": _open_postgres,
    "postgres": _open_postgres,
    "memory": _open_memory,
}
"""URL scheme -> its opener, as dogpile.cache's registry maps a name to a backend: the
families stampede ships, and any ``register_scheme`` adds."""


def register_scheme(scheme: str, opener: Opener) -> None:
    """Let ``Stampede.from_url`` open ``scheme://`` URLs: ``opener(url, connections)``
    makes what the URL names and returns an ``Opened`` (a backend builder, and a close).
    A scheme is opened by one opener: registering another for it is a ``ConfigError``."""
    name = scheme.lower()
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*", name):
        raise ConfigError(f"a URL scheme is a letter then letters, digits, '+', '.' or '-', got {scheme!r}")
    if not callable(opener):
        raise ConfigError(f"register_scheme takes an opener (url, connections) -> Opened, got {opener!r}")
    known = SCHEMES.get(name)
    if known is not None and known is not opener:
        raise ConfigError(f"{name}:// URLs are opened by {known!r} already")
    SCHEMES[name] = opener


def open_url(url: str, connections: Connections) -> Opened:
    """What ``url`` names, opened by its scheme's opener (``ConfigError`` for a scheme
    nobody opens)."""
    scheme = urlsplit(url).scheme.lower()
    opener = SCHEMES.get(scheme)
    if opener is None:
        known = ", ".join(f"{name}://" for name in SCHEMES)
        raise ConfigError(f"bad URL {redacted(url)!r}: no backend serves {scheme!r}; a URL starts with one of {known}")
    opened = opener(url, connections)
    if not isinstance(opened, Opened):
        raise ConfigError(f"the opener of {scheme}:// returned {opened!r}, not a stampede.backends.Opened")
    return opened


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
    """The backend the layer's keywords name (``Stampede(...)``): ``backend=``'s, or the
    family ``client=``, ``async_client=`` or ``postgres=`` names (the embedded one for
    none), with the lease service ``redlock=`` or ``zookeeper=`` composed onto it."""
    if redlock is not None and zookeeper is not None:
        raise ConfigError("redlock= and zookeeper= are two lease services: a layer's leases take one at most")
    if backend is not None:
        if any(given is not None for given in (client, async_client, postgres)):
            raise ConfigError("backend= is the whole backend: pass no client, async_client or postgres with it")
        built = built_by(backend, options)
    else:
        if redlock is not None and client is None and async_client is None:
            raise ConfigError("redlock= needs a cache server: pass a redis client, or use Stampede.from_url")
        if zookeeper is not None and client is None and async_client is None:
            raise ConfigError("zookeeper= holds leases beside a cache server: pass a redis client")
        built = _built_from_keywords(options, client, async_client, postgres)
    if redlock is not None:
        return built.with_leases(redlock.lease_service())
    if zookeeper is not None:
        return _with_zookeeper(built, zookeeper)
    return built


def _built_from_keywords(options: BackendOptions, client: Any, async_client: Any, postgres: Any) -> Backend:
    if postgres is not None:
        if client is not None or async_client is not None:
            raise ConfigError("postgres= is the whole store: pass no redis client with it")
        return _postgres(postgres, options)
    if client is None and async_client is None:
        return memory_builder()(options)
    return redis_builder(client, async_client)(options)


def _with_zookeeper(backend: Backend, zookeeper: Any) -> Backend:
    """``zookeeper=``: the ZooKeeper family's lease service, composed onto ``backend``."""
    backend.check_takes_leases("zookeeper")  # before a ZooKeeper session is opened
    try:
        from ._backends.zookeeper.backend import zookeeper_leases
    except ImportError as error:
        raise ConfigError(f"zookeeper= needs kazoo: pip install 'stampede-guard[zookeeper]' ({error})") from None
    return backend.with_leases(zookeeper_leases(zookeeper))


def _nothing() -> None:
    pass


def _postgres(postgres: Any, options: BackendOptions) -> Backend:
    """``postgres=``: a psycopg_pool ``ConnectionPool``, or a ``postgresql://`` URL for a
    pool with the default bounds, which the store owns."""
    if isinstance(postgres, str):
        if SCHEMES.get(urlsplit(postgres).scheme.lower()) is not _open_postgres:
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


__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_SOCKET_TIMEOUT",
    "SCHEMES",
    "AsyncRedisLockServers",  # Redlock's servers (``stampede.Redlock``)
    "Backend",
    "BackendOptions",
    "Connections",
    "LeaseService",
    "Opened",
    "Opener",
    "RedisLockServers",
    "Store",
    "backend_for",
    "open_url",
    "register_scheme",
]
