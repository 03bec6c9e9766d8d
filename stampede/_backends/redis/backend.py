"""The Redis family's backend: one server, a Sentinel master or a Cluster, through
redis-py clients the layer was given or ``from_url`` made."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster

from ..._core.backend import DEFAULT_SOCKET_TIMEOUT, Backend, BackendOptions
from ..._core.config import check_seconds
from ..._core.near import NearChannel
from ..._core.store import AsyncStore
from ..breaker import CircuitBreaker, NodeBreakers
from .astore import AsyncRedisStore
from .commands import EvictionCheck, is_cluster
from .inspect import RedisInspector
from .store import RedisStore
from .switches import NO_SWITCHES, Switches, SwitchWatch, sentinel_settings
from .tracking import Tracker

log = logging.getLogger("stampede")


def redis_backend(client: Any, async_client: Any, options: BackendOptions) -> Backend:
    """A backend over a blocking client, an asyncio one (or a function making one per
    event loop), or both. One breaker per server serves every store of the layer."""
    settings = options.settings
    breaker = CircuitBreaker(settings.breaker_threshold, settings.breaker_cooldown, on_change=options.on_breaker_change)
    node_breakers = NodeBreakers(  # a cluster's or a Sentinel set's, one per server
        settings.breaker_threshold, settings.breaker_cooldown, on_change=options.on_breaker_change
    )
    eviction = EvictionCheck()  # asked once for the layer, blocking and async stores alike
    # Every invalidation asks the namespace's near caches to drop their copies, whether
    # this layer keeps one or not (see docs/near-cache.md).
    near_channel = NearChannel(options.namespace)
    backend = Backend(name="redis", store=None, make_async_store=None, takes_lease_services=True)
    switches = master_switches(client, async_client)
    if switches is not None:
        backend.close_first.append(switches.close)
    if client is not None:
        timeout = socket_timeout(client)
        backend.store = RedisStore(client, timeout, breaker, eviction, node_breakers, near=near_channel)
        backend.inspector = RedisInspector(client)

        def make_tracker(copies: Any, lease: float) -> Tracker:
            return Tracker(client, near_channel, copies, timeout, lease)

        backend.make_tracker = make_tracker
    else:
        backend.near_refusal = (
            "near_cache needs a blocking client for its invalidation stream: pass one too, or use Stampede.from_url"
        )
    if async_client is not None:
        backend.make_async_store = async_store_maker(
            async_client, breaker, eviction, node_breakers, near_channel, switches or NO_SWITCHES
        )
    return backend


def master_switches(client: Any, async_client: Any) -> SwitchWatch | None:
    """Where the layer reaches its master through Sentinel, a watch of the sentinels'
    switches (see ``switches``), started. Its sentinels are those of the blocking client,
    else of the asyncio one; a function making asyncio clients alone names none."""
    pool = getattr(client if client is not None else async_client, "connection_pool", None)
    found = sentinel_settings(pool)
    if found is None:
        return None
    service, sentinels = found
    switched = pool.get_master_address if client is not None else _nothing  # type: ignore[union-attr]
    return SwitchWatch(service, sentinels, switched).start()


def _nothing() -> None:
    pass


def _check_client_timeouts(client: Any) -> None:
    """A client's timeouts must be None or usable: redis-py takes -1 and fails every call."""
    kwargs = client.get_connection_kwargs()
    for name in ("socket_timeout", "socket_connect_timeout"):
        if kwargs.get(name) is not None:
            check_seconds(f"the client's {name}", kwargs[name])


def socket_timeout(client: Any) -> float:
    _check_client_timeouts(client)
    timeout = client.get_connection_kwargs().get("socket_timeout")
    if timeout is None:
        log.warning(
            "stampede: the redis client has no socket_timeout; a stalled server can "
            "block callers without bound (see Stampede.from_url)"
        )
    return float(timeout or DEFAULT_SOCKET_TIMEOUT)


def async_store_maker(
    async_client: Any,
    breaker: CircuitBreaker,
    eviction: EvictionCheck,
    node_breakers: NodeBreakers,
    near: NearChannel,
    switches: Switches = NO_SWITCHES,
) -> Callable[[], AsyncStore]:
    """A maker of one event loop's store: over the given client, or over a new one from
    the given function. The store owns (closes) a client it had made, and when that
    client's pool does not block for a free connection, bounds its commands to the pool's
    size so that a burst waits for a connection instead of failing."""
    if callable(async_client) and not isinstance(
        async_client, (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)
    ):
        factory = async_client

        def make() -> AsyncStore:
            client = factory()
            timeout = socket_timeout(client)
            if is_cluster(client):
                # It bounds each node's connections as a plain pool does (and fails beyond):
                # bounding its commands to that number bounds every node's.
                slots = client.get_connection_kwargs().get("max_connections")
            else:
                pool = client.connection_pool
                blocks = isinstance(pool, redis.asyncio.BlockingConnectionPool)
                slots = None if blocks else getattr(pool, "max_connections", None)
            return AsyncRedisStore(
                client,
                timeout,
                breaker,
                owns_client=True,
                slots=slots,
                slot_timeout=timeout,
                eviction=eviction,
                node_breakers=node_breakers,
                near=near,
                switches=switches,
            )

        return make
    client = async_client
    timeout = socket_timeout(client)
    return lambda: AsyncRedisStore(
        client, timeout, breaker, eviction=eviction, node_breakers=node_breakers, near=near, switches=switches
    )
