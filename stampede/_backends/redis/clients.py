"""The redis-py clients ``Stampede.from_url`` makes: one server, a Redis Cluster, or the
master a set of sentinels names. Each with bounded timeouts and no hidden retries.

URL forms:

* ``redis://`` / ``rediss://`` / ``unix://``: one server (redis-py's own form).
* the same with ``cluster=True``: any node of a Redis Cluster. The client discovers the
  others (``CLUSTER SLOTS``), at once for the blocking client.
* ``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service[/db]``: the
  master the sentinels at those addresses (port 26379 unless given) know as
  ``service``. The user and password are the master's.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from ..._errors import BackendUnavailable, ConfigError
from ..._redact import redacted

SENTINEL_SCHEME = "redis+sentinel"
POSTGRES_SCHEMES = ("postgresql", "postgres")
SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL."""

    addresses: list[tuple[str, int]]
    service: str
    db: int
    username: str | None
    password: str | None


def parse_sentinel_url(url: str) -> SentinelURL | None:
    """The parts of a ``redis+sentinel://`` URL. None for any other scheme."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        return None
    netloc = parts.netloc.rpartition("@")[2]
    addresses = []
    for address in netloc.split(","):
        host, _, port = address.rpartition(":") if address.count(":") == 1 else (address, "", "")
        try:
            addresses.append((host or address, int(port) if port else SENTINEL_PORT))
        except ValueError:
            raise ConfigError(f"bad sentinel address {address!r} in {redacted(url)}") from None
    path = [unquote(part) for part in parts.path.split("/") if part]
    if not addresses or not all(host for host, _ in addresses) or len(path) not in (1, 2):
        raise ConfigError(
            f"expected {SENTINEL_SCHEME}://host[:port][,host[:port]...]/service[/db], got {redacted(url)}"
        )
    if len(path) == 2 and not path[1].isdigit():
        raise ConfigError(f"the database in {redacted(url)} must be a number")
    return SentinelURL(
        addresses,
        path[0],
        int(path[1]) if len(path) == 2 else 0,
        unquote(parts.username) if parts.username else None,
        unquote(parts.password) if parts.password else None,
    )


AsyncMaker = Callable[[], Any]


def is_postgres_url(url: str) -> bool:
    return urlsplit(url).scheme in POSTGRES_SCHEMES


class ConnectionQueue:
    """The free connections of a blocking pool (redis-py's ``BlockingConnectionPool``
    takes its ``queue_class``): what the pool uses of ``queue.LifoQueue`` (``get``,
    ``put_nowait``, ``queue``), with one lock taken per get or put. ``queue.LifoQueue``
    goes through a ``Condition`` each time, which cost about as much as the rest of a
    hit's own work. Here a put wakes a getter only when one is waiting.

    Not a subclass: under gevent's monkey-patching ``queue.LifoQueue`` is gevent's own
    class, with none of the standard one's internals. The lock and condition are made
    when the pool is, so they are gevent's there too."""

    def __init__(self, maxsize: int = 0) -> None:
        self.maxsize = maxsize
        self.queue: list[Any] = []  # the pool reads it to list its free connections
        self._mutex = threading.Lock()
        self._not_empty = threading.Condition(self._mutex)
        self._getters = 0  # callers waiting in get(), under _mutex

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        with self._mutex:
            if not self.queue:
                if not block:
                    raise queue.Empty
                self._wait_for_one(timeout)
            return self.queue.pop()

    def _wait_for_one(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._getters += 1
        try:
            while not self.queue:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise queue.Empty
                self._not_empty.wait(remaining)
        finally:
            self._getters -= 1

    def put_nowait(self, item: Any) -> None:
        # The pool puts back only what it took out: the queue is never full (raise as
        # LifoQueue's put_nowait would, rather than wait, if it ever were).
        with self._mutex:
            if 0 < self.maxsize <= len(self.queue):
                raise queue.Full
            self.queue.append(item)
            if self._getters:
                self._not_empty.notify()


def make_clients(
    url: str, *, cluster: bool, socket_timeout: float, socket_connect_timeout: float, max_connections: int
) -> tuple[Any, AsyncMaker]:
    """A blocking client for ``url`` and a maker of an asyncio one (called once per event
    loop). Callers beyond ``max_connections`` wait for a connection, one socket timeout at
    most (the asyncio store bounds its own commands, see ``_backends.redis.astore``)."""
    timeouts = dict(socket_timeout=socket_timeout, socket_connect_timeout=socket_connect_timeout)
    no_retries = Retry(NoBackoff(), 0)
    sentinel = parse_sentinel_url(url)
    if sentinel is not None:
        if cluster:
            raise ConfigError("cluster=True and a redis+sentinel:// URL: a cluster does not use sentinels")
        return _sentinel_clients(sentinel, timeouts, no_retries, max_connections)
    if cluster:
        return _cluster_clients(url, timeouts, no_retries, max_connections)
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=socket_timeout,
        retry=no_retries,
        queue_class=ConnectionQueue,
        **timeouts,
    )
    client = redis.Redis(connection_pool=pool, retry=no_retries)

    def make_async_client() -> redis.asyncio.Redis:
        no_async_retries = redis.asyncio.retry.Retry(NoBackoff(), 0)
        async_pool = redis.asyncio.ConnectionPool.from_url(
            url, max_connections=max_connections, retry=no_async_retries, **timeouts
        )
        return redis.asyncio.Redis(connection_pool=async_pool, retry=no_async_retries)

    return client, make_async_client


def _cluster_clients(
    url: str, timeouts: dict[str, Any], no_retries: Retry, max_connections: int
) -> tuple[redis.cluster.RedisCluster, AsyncMaker]:
    """Cluster clients. The blocking one asks the node in ``url`` for the cluster's slots
    now: a server that is not a cluster node is a ``ConfigError`` here, and one that does
    not answer a ``BackendUnavailable``."""
    try:
        client = redis.cluster.RedisCluster.from_url(
            url,
            retry=no_retries,
            connection_pool_class=redis.BlockingConnectionPool,
            max_connections=max_connections,
            timeout=timeouts["socket_timeout"],  # the longest wait for a free connection
            **timeouts,
        )
    except RedisClusterException as error:
        if "not enabled" in str(error):
            raise ConfigError(f"cluster=True, but {redacted(url)} is not a cluster node: {error}") from None
        raise BackendUnavailable(f"cannot reach the cluster at {redacted(url)}: {error}") from error
    except redis.RedisError as error:
        raise BackendUnavailable(f"cannot reach the cluster at {redacted(url)}: {error}") from error

    def make_async_client() -> redis.asyncio.cluster.RedisCluster:
        no_async_retries = redis.asyncio.retry.Retry(NoBackoff(), 0)
        return redis.asyncio.cluster.RedisCluster.from_url(
            url, retry=no_async_retries, max_connections=max_connections, **timeouts
        )

    return client, make_async_client


class BlockingSentinelConnectionPool(redis.sentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """The master's pool through Sentinel that waits for a free connection (``timeout``
    at most) as ``BlockingConnectionPool`` does, where redis-py's Sentinel pool fails at
    ``max_connections`` ("Too many connections")."""


def _sentinel_clients(
    sentinel: SentinelURL, timeouts: dict[str, Any], no_retries: Retry, max_connections: int
) -> tuple[redis.Redis, AsyncMaker]:
    """Clients of the master the sentinels name, which follow it through a failover (as
    redis-py's Sentinel pools do: a connection that fails or finds a demoted master asks
    the sentinels again). A service no answering sentinel knows is a ``ConfigError`` now.
    if no sentinel answers, the clients are made anyway and find the master later."""
    auth: dict[str, Any] = {"username": sentinel.username, "password": sentinel.password, "db": sentinel.db}
    # The sentinels' own clients take no retry from the master's settings: each is asked
    # once per lookup, so a lookup with no sentinel answering costs one socket timeout
    # per sentinel, not redis-py's default retries of each.
    manager = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis-py 8.2
        sentinel.addresses, sentinel_kwargs=dict(timeouts, retry=no_retries), retry=no_retries, **timeouts
    )
    try:
        _check_service(manager, sentinel)
    except ConfigError:
        for one in manager.sentinels:
            one.close()
        raise
    client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis-py 8.2
        sentinel.service,
        connection_pool_class=BlockingSentinelConnectionPool,
        queue_class=ConnectionQueue,
        max_connections=max_connections,
        timeout=timeouts["socket_timeout"],  # the longest wait for a free connection
        retry=no_retries,
        **auth,
    )

    def make_async_client() -> redis.asyncio.Redis:
        no_async_retries = redis.asyncio.retry.Retry(NoBackoff(), 0)
        async_manager = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis-py 8.2
            sentinel.addresses,
            sentinel_kwargs=dict(timeouts, retry=no_async_retries),
            retry=no_async_retries,
            **timeouts,
        )
        # Its pool fails beyond max_connections. The asyncio store bounds its commands to
        # that number (see _backends.redis.astore), so callers wait instead.
        async_client: redis.asyncio.Redis = async_manager.master_for(
            sentinel.service, retry=no_async_retries, max_connections=max_connections, **auth
        )
        return async_client

    return client, make_async_client


def _check_service(manager: redis.sentinel.Sentinel, sentinel: SentinelURL) -> None:
    answered = False
    for client in manager.sentinels:
        try:
            masters = client.sentinel_masters()
        except redis.RedisError:
            continue
        answered = True
        if sentinel.service in masters:
            return
    if answered:
        addresses = ",".join(f"{host}:{port}" for host, port in sentinel.addresses)
        raise ConfigError(f"no sentinel at {addresses} knows a master named {sentinel.service!r}")


def close_client(client: Any) -> None:
    """Close a client ``make_clients`` made, and its connections (a client over a pool of
    ours does not close the pool with itself)."""
    client.close()
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.disconnect()
    if isinstance(client, redis.cluster.RedisCluster):
        # Its close() closes each node's client, which leaves the node's pool connected.
        for node in [*client.nodes_manager.startup_nodes.values(), *client.nodes_manager.nodes_cache.values()]:
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()
    manager = getattr(pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        sentinel.close()
