"""``Stampede``: a cache layer over one store, and the default layer of the module."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
import threading
from typing import Any, Callable, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._codec import Codec, Serializer
from ._config import Policy, Settings, check_namespace
from ._errors import ConfigError
from ._keys import KeyBuilder
from ._loader import CachedLoader, P
from ._memory import MemoryStore
from ._observe import RateLimitedLog, Stats
from ._redis import RedisStore
from ._store import Store
from ._sync import LoaderSpec, SyncRunner
from ._watchdog import Watchdog

log = logging.getLogger("stampede")

R = TypeVar("R")

DEFAULT_SOCKET_TIMEOUT = 2.0
DEFAULT_CONNECT_TIMEOUT = 1.0


class Stampede:
    """A cache layer: loaders decorated by it share one store, one set of counters, one
    lease watchdog and one subscriber connection.

    ``Stampede(client)`` uses a redis-py client you configured; give it a
    ``socket_timeout``, a ``socket_connect_timeout`` and ``retry=Retry(NoBackoff(), 0)``,
    or one command against a stalled server can outlast every bound here.
    ``Stampede.from_url(url)`` builds such a client. ``Stampede()`` keeps everything in
    this process's memory: no server, protection across threads only.
    """

    def __init__(
        self,
        client: redis.Redis | None = None,
        *,
        namespace: str = "stampede",
        serializer: Serializer | None = None,
        max_entries: int = 10_000,
        **settings: Any,
    ) -> None:
        try:
            self.settings = Settings(**settings)
        except TypeError as error:
            raise ConfigError(f"unknown setting: {error}") from None
        self.namespace = check_namespace(namespace)
        self._codec = Codec(serializer)
        self._stats = Stats()
        self._watchdog = Watchdog()
        self._owned_client: redis.Redis | None = None
        store: Store
        if client is None:
            store = MemoryStore(max_entries)
        else:
            socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
            if socket_timeout is None:
                log.warning(
                    "stampede: the redis client has no socket_timeout; a stalled server can "
                    "block callers without bound (see Stampede.from_url)"
                )
            store = RedisStore(client, subscribe_timeout=socket_timeout or DEFAULT_SOCKET_TIMEOUT)
        self._runner = SyncRunner(store, self._stats, RateLimitedLog(log), self._watchdog)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        socket_connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        max_connections: int = 64,
        namespace: str = "stampede",
        serializer: Serializer | None = None,
        **settings: Any,
    ) -> Stampede:
        """A layer over a client for ``url`` with bounded timeouts and no hidden retries,
        so no call spends longer than wait_timeout plus one socket timeout on Redis.
        ``max_connections`` bounds the pool; threads beyond it wait for a connection."""
        no_retries = Retry(NoBackoff(), 0)
        # A blocking pool: a burst of threads waits (one socket timeout at most) for a
        # connection instead of failing with "Too many connections".
        pool = redis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=socket_timeout,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            retry=no_retries,
        )
        client = redis.Redis(connection_pool=pool, retry=no_retries)
        layer = cls(client, namespace=namespace, serializer=serializer, **settings)
        layer._owned_client = client
        return layer

    def cached_loader(
        self,
        template: str | None = None,
        *,
        ttl: float | None = None,
        null_ttl: float | None = None,
        lock_ttl: float | None = None,
        wait_timeout: float | None = None,
        on_wait_timeout: Policy | None = None,
        on_redis_error: Policy | None = None,
        serializer: Serializer | None = None,
    ) -> Callable[[Callable[P, R]], CachedLoader[P, R]]:
        """Decorate a loader. ``template`` (``"product:{product_id}"``) names the entry from
        the loader's arguments; without one the key is the loader's qualified name and all
        its arguments. Keyword settings override the layer's for this loader."""
        settings = self.settings.replace(
            ttl=ttl,
            null_ttl=null_ttl,
            lock_ttl=lock_ttl,
            wait_timeout=wait_timeout,
            on_wait_timeout=on_wait_timeout,
            on_redis_error=on_redis_error,
        )
        codec = self._codec if serializer is None else Codec(serializer)

        def decorate(func: Callable[P, R]) -> CachedLoader[P, R]:
            if inspect.iscoroutinefunction(func):
                raise ConfigError(f"{func.__qualname__} is async; async loaders are not supported yet")
            keys = KeyBuilder(func, template, self.namespace, settings.max_key_length)
            return CachedLoader(LoaderSpec(func, settings, codec), self._runner, keys)

        return decorate

    def stats(self) -> dict[str, int]:
        """Counters since the layer was made: hits, misses, loads, collapsed, lock_waits, ..."""
        return self._stats.snapshot()

    def close(self) -> None:
        """Stop the layer's threads and close the connections it opened."""
        self._watchdog.close()
        self._runner.store.close()
        if self._owned_client is not None:
            self._owned_client.close()

    def __enter__(self) -> Stampede:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        store = type(self._runner.store).__name__
        return f"<Stampede namespace={self.namespace!r} store={store} {dataclasses.asdict(self.settings)}>"


_default_layer: Stampede | None = None
_default_lock = threading.Lock()


def default_layer() -> Stampede:
    """The module's layer: over STAMPEDE_REDIS_URL if it is set, else embedded. Connections
    are opened on first use, so building it at import time is cheap."""
    global _default_layer
    with _default_lock:
        if _default_layer is None:
            url = os.environ.get("STAMPEDE_REDIS_URL")
            _default_layer = Stampede.from_url(url) if url else Stampede()
        return _default_layer


def cached_loader(
    template: str | None = None, **options: Any
) -> Callable[[Callable[P, R]], CachedLoader[P, R]]:
    """``Stampede.cached_loader`` on the default layer (see ``default_layer``)."""
    return default_layer().cached_loader(template, **options)
