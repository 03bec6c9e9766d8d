"""``Stampede``: a cache layer over one store, and the default layer of the module.

``Stampede`` is a facade: it builds the layer's parts (``_parts.LayerParts``: the
backend, the runners, the counters) and hands them to rooms of one job each, whose
methods it names and documents: making loaders (``_decorators``), named locks
(``_lock.Locks``), invalidating many entries (``_invalidation``) and hot sets
(``_hot_sets``). Its options are declared once, for ``Stampede(...)`` and
``from_url(...)`` alike (``_options``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import os
import threading
import typing
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar, Union, overload

from ._acached import AsyncCachedLoader
from ._astream import AsyncCachedStream
from ._backend import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SOCKET_TIMEOUT,
    BackendBuilder,
    BackendOptions,
    Connections,
    backend_for,
    open_url,
)
from ._cached import CachedLoader
from ._core.codec import Codec, Serializer
from ._core.config import (
    LOADER_SETTING_NAMES,
    MANY_LOADER_SETTING_NAMES,
    STREAM_SETTING_NAMES,
    LoaderSettings,
    ManyLoaderSettings,
    Settings,
    StreamSettings,
    check_count,
    check_seconds,
    refuse_unknown,
    renamed,
)
from ._core.observer import Observer
from ._core.store import AsyncStore, Store
from ._decorators import Decorating, LoaderDecorator, ManyLoaderDecorator, StreamDecorator
from ._drivers.arunner import AsyncRunner
from ._drivers.near import NearCache
from ._drivers.observe import Events, RateLimitedLog
from ._drivers.runner import Runner
from ._drivers.tracing import GLOBAL, Tracing
from ._drivers.watchdog import Watchdog
from ._errors import ConfigError
from ._hot_sets import HotSets
from ._invalidation import Invalidation
from ._loader import P
from ._lock import Lock, Locks
from ._options import LAYER_KEYWORDS, LayerOptions, Options
from ._parts import LayerParts
from ._redact import redacted
from ._stream import CachedStream
from ._streaming import OnLeaderFailure, OnLeave
from ._warming import Progress, WarmReport

if typing.TYPE_CHECKING:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    from psycopg_pool import ConnectionPool
    from typing_extensions import Unpack  # typing's, from Python 3.11

    from ._core.backend import Inspector
    from .postgres import AdvisoryLock

log = logging.getLogger("stampede")

R = TypeVar("R")

REFRESH_CLOSE_TIMEOUT = 5.0  # the longest close() waits for background refreshes under way


AsyncClient = Union[
    "redis.asyncio.Redis",
    "redis.asyncio.cluster.RedisCluster",
    Callable[[], "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"],
]


M = TypeVar("M", bound=Callable[..., Any])


def _layer_method(settings: frozenset[str]) -> Callable[[M], M]:
    """A layer's decorator maker, taking ``settings`` as keyword arguments, that refuses,
    with a ``ConfigError`` that says what to do, a call on the class instead of on a
    layer, and a setting's name it does not know (naming the closest one), where Python
    would say only ``TypeError``."""
    return functools.partial(_checked_layer_method, settings=settings)


def _checked_layer_method(method: M, settings: frozenset[str]) -> M:
    parameters = set(inspect.signature(method).parameters) - {"self", "template", "settings"} | settings
    name = method.__name__

    @functools.wraps(method)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if not args or not isinstance(args[0], Stampede):
            raise ConfigError(
                f"{name} is a method of a layer: make one (layer = Stampede.from_url(...), or Stampede() "
                f"for one process) and decorate with @layer.{name}(...), or use stampede.{name}(...), "
                "whose layer is the default one"
            )
        refuse_unknown(kwargs, parameters)
        return method(*args, **kwargs)

    return checked  # type: ignore[return-value]


class Stampede:
    """A cache layer: loaders decorated by it share one store, one set of counters, one
    lease watchdog and one subscriber connection (per event loop for async loaders).

    ``Stampede(client)`` uses a redis-py client you configured. Give it a
    ``socket_timeout``, a ``socket_connect_timeout`` and ``retry=Retry(NoBackoff(), 0)``,
    or one command against a stalled server can outlast every bound here. For
    ``async def`` loaders add ``async_client=``: a redis.asyncio client (usable in one
    event loop, as redis.asyncio clients are), or a function that makes one, called once
    per event loop. ``Stampede.from_url(url)`` builds both, with bounded timeouts.
    ``Stampede()`` keeps everything in this process's memory: no server, protection
    across threads and tasks only.

    ``postgres=`` (a ``postgresql://`` URL or a psycopg_pool ``ConnectionPool``) keeps
    everything in PostgreSQL instead: values, leases, fencing, queues, and wake-ups by
    LISTEN/NOTIFY (``_backends.postgres.schema``). ``backend=`` takes a maker of the
    whole backend instead (``stampede.backends``): one of the families stampede ships
    (``backends.redis(client)``), or one of your own, which the shipped contract suite
    checks (``stampede.testing.contract``).

    Every other keyword is an option or a setting, the same for ``from_url``
    (``LayerOptions``, each setting's meaning ``Settings``'s):

    ``redlock=Redlock(urls)`` holds every load's lease on a majority of those lock
    servers as well as on the cache server, so no two loads of a key run at once even if
    the cache server loses its keys. Values and messages stay on the cache server (see
    ``_core.majority``). Its servers must be URLs for async loaders. ``zookeeper=``
    (hosts, or a started kazoo client) holds every load's lease as a ZooKeeper node as
    well, beside a Redis client: a holder's lease ends with its session, and
    ``layer.lock()`` is ZooKeeper's fair lock. See docs/lock-services.md.

    ``tracer_provider=`` traces the layer's calls with that OpenTelemetry provider's
    tracer; without it, with the global provider once the application sets one
    (``stampede.otel.traces``). ``meter_provider=`` records its metrics as that
    provider's instruments (``stampede.otel.OpenTelemetryMetrics``).

    ``near_cache=True`` (a setting, also per loader) serves fresh values from copies in
    this process with no I/O, kept exact across processes by a tracking connection and a
    lease of ``near_lease`` seconds (see ``_core.near`` and docs/near-cache.md). It needs
    a blocking client. ``near_cache_entries`` and ``near_cache_bytes`` bound the copies.
    ``max_entries`` bounds the embedded store, ``background_refreshes`` the refreshes
    under way at once.
    """

    def __init__(
        self,
        client: redis.Redis | None = None,
        *,
        async_client: AsyncClient | None = None,
        postgres: ConnectionPool[Any] | str | None = None,
        backend: BackendBuilder | None = None,
        **options: Unpack[LayerOptions],
    ) -> None:
        refuse_unknown(options, LAYER_KEYWORDS)
        chosen, settings = Options.apart(options)
        self.settings = Settings(**renamed(settings, stacklevel=2))
        self.namespace = namespace = chosen.namespace
        codec = Codec(
            chosen.serializer,
            compress_above=self.settings.compress_above,
            compression=self.settings.compression,
            max_value_bytes=self.settings.max_value_bytes,
        )
        watchdog = Watchdog()
        warn = RateLimitedLog(logging.getLogger("stampede.cache"), namespace=namespace)
        self._events = events = Events(namespace, warn)
        for observer in chosen.observers:
            events.add(observer)
        if chosen.meter_provider is not None:
            from .otel.metrics import OpenTelemetryMetrics

            events.add(OpenTelemetryMetrics(chosen.meter_provider))
        tracing = GLOBAL if chosen.tracer_provider is None else Tracing(chosen.tracer_provider)
        tracing.ask_now()  # a global provider set before the layer traces its first calls, all of them
        backend_options = BackendOptions(namespace, self.settings, chosen.max_entries, events.breaker_changed)
        self._backend = built = backend_for(
            backend_options,
            client=client,
            async_client=async_client,
            postgres=postgres,
            redlock=chosen.redlock,
            zookeeper=chosen.zookeeper,
            backend=backend,
        )
        self._near: NearCache | None = None
        if built.make_tracker is not None:
            self._near = NearCache(chosen.near_cache_entries, chosen.near_cache_bytes, events, built.start_tracking)
            built.track(self._near, chosen.near_lease)
        store, make_async_store = built.store, built.make_async_store
        refreshes = chosen.background_refreshes
        policy, servers, make_servers = built.lease_policy, built.lock_servers, built.make_async_lock_servers
        self._runner = Runner(store, events, warn, watchdog, refreshes, policy, servers) if store is not None else None
        self._async_runner = (
            AsyncRunner(make_async_store, events, warn, refreshes, policy, make_servers) if make_async_store else None
        )
        for runner in (self._runner, self._async_runner):
            if runner is not None:
                runner.near = self._near
                runner.tracing = tracing
        # The rooms hold the parts, never the layer: a layer in a cycle of its own is freed
        # late, by the collector.
        parts = LayerParts(
            namespace, self.settings, built, self._runner, self._async_runner, self._near, events, warn, watchdog
        )
        self._parts = parts
        self._invalidation = Invalidation(parts)
        self._hot_sets = HotSets(parts)
        self._decorating = Decorating(parts, codec, self._hot_sets, self._invalidation)
        self._locks = Locks(parts)
        self._decorating.check_near(self.settings)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        socket_connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        check: bool = False,
        cluster: bool = False,
        **options: Unpack[LayerOptions],
    ) -> Stampede:
        """A layer over clients for ``url`` with bounded timeouts and no hidden retries,
        so no call spends longer than wait_timeout plus one socket timeout on Redis.
        ``max_connections`` bounds the pool (one pool for threads, one per event loop
        for async loaders, made when that loop first calls). Callers beyond it wait,
        one socket timeout at most, for a connection instead of failing. ``check=True``
        runs ``check()`` before returning: fail fast on a wrong password or a replica.
        Every other keyword is ``Stampede(...)``'s (``LayerOptions``).

        ``cluster=True`` treats ``url`` as one node of a Redis Cluster, and
        ``redis+sentinel://host:port[,host:port...]/service[/db]`` names the master a set
        of sentinels knows as ``service`` (see ``_backends.redis.clients`` and docs/scaling.md). A
        ``postgresql://`` URL makes the store PostgreSQL (a pool of ``max_connections``,
        ``socket_timeout`` as the statement timeout), ``memory://`` the embedded store, and a
        scheme registered with ``stampede.backends.register_scheme`` its own backend.
        ``redlock=`` or ``zookeeper=`` adds a lease service (docs/lock-services.md)."""
        check_seconds("socket_timeout", socket_timeout)
        check_seconds("socket_connect_timeout", socket_connect_timeout)
        check_count("max_connections", max_connections)
        refuse_unknown(options, LAYER_KEYWORDS)  # before any connection is opened
        opened = open_url(url, Connections(socket_timeout, socket_connect_timeout, max_connections, cluster))
        try:
            layer = cls(backend=opened.builder, **options)
        except BaseException:  # a setting refused: nothing left open
            opened.close()
            raise
        layer._backend.close_last.append(opened.close)
        if check:
            try:
                layer.check()
            except BaseException:
                layer.close()
                raise
        return layer

    @overload
    def cached_loader(self, template: Callable[P, Coroutine[Any, Any, R]], /) -> AsyncCachedLoader[P, R]: ...  # type: ignore[overload-overlap]

    @overload
    def cached_loader(self, template: Callable[P, R], /) -> CachedLoader[P, R]: ...

    @overload
    def cached_loader(
        self,
        template: str | None = None,
        *,
        serializer: Serializer | None = None,
        tags: Sequence[str] | None = None,
        verify_equal: Callable[[Any, Any], bool] | None = None,
        version: str | bool | None = None,
        **settings: Unpack[LoaderSettings],
    ) -> LoaderDecorator: ...

    @_layer_method(LOADER_SETTING_NAMES)
    def cached_loader(
        self,
        template: str | Callable[..., Any] | None = None,
        *,
        serializer: Serializer | None = None,
        tags: Sequence[str] | None = None,
        verify_equal: Callable[[Any, Any], bool] | None = None,
        version: str | bool | None = None,
        **settings: Unpack[LoaderSettings],
    ) -> Any:
        """Decorate a loader, plain or ``async def``, or a method (``self`` is not part of
        the key). ``template`` (``"product:{product_id}"``) names the entry from the
        loader's arguments. Without one the key is the loader's ``module.qualname`` and
        all its arguments, which must name one loader of this layer (a lambda or a
        function made inside another needs a template). Keyword settings override the
        layer's for this loader. ``@layer.cached_loader`` without parentheses works too.
        ``tags`` (``["category:{category_id}", "catalog"]``): templates over the key's
        fields naming groups the entries belong to, for ``invalidate_tag``.
        ``verify_equal(served, loaded)``: whether two values are the same, for the
        verifications of ``verify_sample`` (by default, their encodings are compared).
        ``version``: the identity of the value type the entries hold, so that two
        versions of an application share a namespace safely through a rolling deploy
        (docs/deploys.md): ``"2"``, or True for a hash of the return annotation's schema."""
        making = self._decorating
        loader_settings = making.settings_for(dict(settings), verify_equal)
        own_budget = "max_concurrent_loads" in settings
        if template is not None and not isinstance(template, str):
            if not callable(template):
                raise ConfigError(f"a key template must be a str, got {template!r}")
            return LoaderDecorator(making, None, loader_settings, serializer, None, None, False, None)(template)
        return LoaderDecorator(making, template, loader_settings, serializer, tags, verify_equal, own_budget, version)

    @overload
    def cached_stream(self, template: Callable[P, AsyncIterator[R]], /) -> AsyncCachedStream[R]: ...

    @overload
    def cached_stream(self, template: Callable[P, Iterator[R]], /) -> CachedStream[R]: ...

    @overload
    def cached_stream(
        self,
        template: str | None = None,
        *,
        serializer: Serializer | None = None,
        on_leave: OnLeave = "finish",
        on_leader_failure: OnLeaderFailure = "raise",
        **settings: Unpack[StreamSettings],
    ) -> StreamDecorator: ...

    @_layer_method(STREAM_SETTING_NAMES)
    def cached_stream(
        self,
        template: str | Callable[..., Any] | None = None,
        *,
        serializer: Serializer | None = None,
        on_leave: OnLeave = "finish",
        on_leader_failure: OnLeaderFailure = "raise",
        **settings: Unpack[StreamSettings],
    ) -> Any:
        """Decorate a generator function, plain or ``async def``, whose chunks (``bytes``,
        or values of ``serializer``: a token's str, an event's dict) concurrent callers for
        one key share as they are made, in any process (docs/streams.md). One caller runs
        it, every other receives each chunk from the first, and the whole stream is kept
        under ``ttl`` and replayed, chunk by chunk, to later callers. ``template`` names
        the entry as ``cached_loader``'s does. ``on_leave``: when the leader's own caller
        stops iterating, "finish" runs the generator to its end for its listeners (and
        keeps the stream), "stop" stops it (its listeners get ``StreamInterrupted``).
        ``on_leader_failure``: when the run a listener follows stops short (its leader
        raised, left or died), "raise" raises ``StreamInterrupted``, "restart" begins
        another run (this caller leads it, or follows another's) and hands the caller
        ``STREAM_RESTARTED`` before the new run's first chunk if it had received any."""
        making = self._decorating
        stream_settings = making.settings_for(dict(settings), None)
        if template is not None and not isinstance(template, str):
            if not callable(template):
                raise ConfigError(f"a key template must be a str, got {template!r}")
            return StreamDecorator(making, None, stream_settings, serializer, on_leave, on_leader_failure)(template)
        return StreamDecorator(making, template, stream_settings, serializer, on_leave, on_leader_failure)

    @_layer_method(MANY_LOADER_SETTING_NAMES)
    def cached_loader_many(
        self,
        template: str,
        *,
        batch: str | None = None,
        serializer: Serializer | None = None,
        tags: Sequence[str] | None = None,
        verify_equal: Callable[[Any, Any], bool] | None = None,
        version: str | bool | None = None,
        **settings: Unpack[ManyLoaderSettings],
    ) -> ManyLoaderDecorator:
        """Decorate a loader of many ids, plain or ``async def``: it takes a collection of
        ids (its parameter ``batch``, by default the one the template leaves out) and
        returns a mapping of id to value. ``template`` names one id's entry
        (``"product:{product_id}"``), the same entry ``cached_loader`` with that template
        names. A call reads every entry in one round trip and loads the missing ones in
        one call, each loaded once across callers and processes. Requests larger than
        ``max_batch`` are split. ``tags``: templates over the entry template's fields
        (the id's too). ``version``: as ``cached_loader``'s, True hashing the schema of
        the mapping's value type (``dict[int, Product]``: ``Product``). Other settings as
        ``cached_loader``'s."""
        making = self._decorating
        loader_settings = making.settings_for(dict(settings), verify_equal)
        if loader_settings.load_timeout or loader_settings.load_soft_timeout:
            raise ConfigError(
                "cached_loader_many does not bound its loads by load_timeout or load_soft_timeout yet: "
                "give load_timeout=0, load_soft_timeout=0 (the layer's apply to cached_loader)"
            )
        if not isinstance(template, str):
            raise ConfigError(
                f'cached_loader_many takes a key template naming one id\'s entry, e.g. "product:{{product_id}}", '
                f"got {template!r}"
            )
        own_budget = "max_concurrent_loads" in settings
        return ManyLoaderDecorator(
            making, template, batch, loader_settings, serializer, tags, verify_equal, own_budget, version
        )

    def lock(
        self,
        name: str,
        *,
        ttl: float | None = None,
        blocking: bool = True,
        timeout: float | None = None,
        retry_interval: float | None = None,
        retries: int | None = None,
        renew: bool = True,
        reentrant: bool = False,
        fair: bool = False,
    ) -> Lock:
        """A named lock in this layer's store (see ``Lock``): ``with layer.lock("report"):``
        or ``async with``. ``ttl`` (default: the layer's lock_ttl) is the lease, renewed
        every ttl/3 while held unless ``renew`` is False. A blocking acquire waits for a
        release message, up to ``timeout`` seconds (None: no limit). ``retry_interval``
        makes it poll instead, and ``retries`` bounds the number of tries after the first.
        ``reentrant``: the thread or task holding it may acquire it again (and must
        release as many times). ``fair``: waiters take it in arrival order. On a layer
        with ``zookeeper=`` every lock is fair, its fencing token is the zxid of the
        holder's node, and the holder's session is its lease: ``ttl`` bounds only the
        cache server's key (see docs/lock-services.md)."""
        options = {"retry_interval": retry_interval, "retries": retries, "renew": renew, "reentrant": reentrant}
        return self._locks.lock(name, ttl, fair, blocking=blocking, timeout=timeout, **options)

    def advisory_lock(self, name: str, *, blocking: bool = True, timeout: float | None = None) -> AdvisoryLock:
        """PostgreSQL's session lock (``pg_advisory_lock``) on a connection of this layer's
        pool, for a layer whose store is PostgreSQL: ``with layer.advisory_lock("job"):``
        or ``async with``. Freed by the database when the holder's session ends. No lease,
        no fencing token (see ``stampede.postgres.AdvisoryLock`` for when it is right)."""
        lock: AdvisoryLock = self._locks.advisory_lock(name, blocking, timeout)
        return lock

    def check(self) -> None:
        """Fail fast: raise ``BackendUnavailable`` naming the cause unless the cache server
        answers and takes writes in this layer's namespace (a wrong password, a read-only
        replica, an ACL user outside its keys, a server down). Under the default
        ``on_backend_error="load"`` such a server would only cost a rate-limited warning per
        call. Also warns if the server may evict leases (see the README). Blocking client
        needed. ``acheck()`` uses this event loop's."""
        if self._runner is None:
            raise ConfigError("check() needs a blocking client: use acheck() in the event loop")
        self._runner.store.check(self.namespace)

    async def acheck(self) -> None:
        """``check()`` with this event loop's client."""
        if self._async_runner is None:
            raise ConfigError("acheck() needs an asyncio client: use check()")
        await self._async_runner.loop_store().check(self.namespace)

    def clear(self) -> int:
        """Invalidate every cache entry of this layer's namespace, as ``invalidate()`` does
        each one (loads in flight are not written, waiters load afresh). Return how many.
        Named locks, and their fencing counters, are left alone: a namespace cleared by
        hand (``SCAN``/``DEL``) would reset the counters too."""
        return self.invalidate_matching("*")

    async def aclear(self) -> int:
        """``clear()`` with this event loop's client."""
        return await self.ainvalidate_matching("*")

    def matching(self, pattern: str, **fields: Any) -> list[str]:
        """The keys of the cache entries whose entry matches ``pattern``: a glob (Redis's
        syntax) over the entry, ``"category-map:*"``, or a template whose ``{field}``
        placeholders take the ``fields`` given and match anything where none is
        (``matching("orders:{shop}:{id}", shop="s1")``). Found with SCAN, never KEYS.
        an entry whose load is in flight is found by its lease."""
        return self._invalidation.matching(pattern, fields)

    async def amatching(self, pattern: str, **fields: Any) -> list[str]:
        """``matching()`` with this event loop's client."""
        return await self._invalidation.amatching(pattern, fields)

    def invalidate_matching(
        self, pattern: str, /, *, on_progress: Callable[[int, int], object] | None = None, **fields: Any
    ) -> int:
        """Invalidate, as ``invalidate()`` does each one, the entries ``matching(pattern,
        **fields)`` finds. Return how many. Entries written after the scan passed them are
        left alone, as they would be by an invalidation a moment earlier. A pattern that
        names one entry (no wildcard, every field given) invalidates it with no scan, and
        counts 1. ``on_progress(done, found)`` is told after each tenth of the entries
        found (each round trip is one entry's, so 100,000 take a while)."""
        return self._invalidation.invalidate_matching(pattern, fields, on_progress)

    async def ainvalidate_matching(
        self, pattern: str, /, *, on_progress: Callable[[int, int], object] | None = None, **fields: Any
    ) -> int:
        """``invalidate_matching()`` with this event loop's client."""
        return await self._invalidation.ainvalidate_matching(pattern, fields, on_progress)

    def invalidate_tag(self, tag: str, **fields: Any) -> int:
        """Invalidate every entry tagged ``tag``, as ``invalidate()`` does each one, and
        keep every load of one that began before this call from writing. ``tag`` is a
        tag as a loader renders it (``"category:7"``), or a tag template whose fields are
        given (``invalidate_tag("category:{id}", id=7)``: escaped as a call's arguments
        are). Once it returns, no caller in any process gets a value those entries held.
        Return how many entries it invalidated. Raises ``BackendUnavailable`` if the
        store fails: call it again (what was done stays done)."""
        return self._invalidation.invalidate_tag(tag, fields, False, "invalidate_tag", "ainvalidate_tag")

    def expire_tag(self, tag: str, **fields: Any) -> int:
        """The soft ``invalidate_tag``: every entry tagged ``tag`` is stale from now on, as
        ``expire()`` makes one (served stale within its stale window, refreshed by the
        next caller), and no load of one that began before this call writes. Return how
        many entries it expired."""
        return self._invalidation.invalidate_tag(tag, fields, True, "expire_tag", "aexpire_tag")

    async def ainvalidate_tag(self, tag: str, **fields: Any) -> int:
        """``invalidate_tag()`` with this event loop's client."""
        return await self._invalidation.ainvalidate_tag(tag, fields, False, "ainvalidate_tag", "invalidate_tag")

    async def aexpire_tag(self, tag: str, **fields: Any) -> int:
        """``expire_tag()`` with this event loop's client."""
        return await self._invalidation.ainvalidate_tag(tag, fields, True, "aexpire_tag", "expire_tag")

    @property
    def serves_blocking(self) -> bool:
        """Whether the layer has a blocking store: its loaders may be plain functions."""
        return self._runner is not None

    @property
    def serves_async(self) -> bool:
        """Whether the layer has a store for event loops: its loaders may be ``async def``."""
        return self._async_runner is not None

    def store(self) -> Store:
        """The layer's store for blocking callers: what a backend's contract suite
        (``stampede.testing.contract``) checks. Reading or writing entries through it
        bypasses the layer's promises. A ``ConfigError`` without a blocking client."""
        return self._parts.blocking_store("store", "loop_store")

    def loop_store(self) -> AsyncStore:
        """``store()`` for the running event loop (each loop has its own)."""
        return self._parts.loop_store("loop_store", "store")

    @property
    def inspector(self) -> Inspector | None:
        """What the command line reads of a shared store (``stampede.cli``), or None when the
        store is not shared (the embedded store lives in one process)."""
        return self._backend.inspector

    def stats(self) -> dict[str, int]:
        """Counters since the layer was made, blocking and async callers together: hits,
        misses, loads, collapsed, lock_waits, ... (``stampede.COUNTERS``, the same
        reports its observers get)."""
        return self._events.counts.snapshot()

    def budget_loads(self) -> dict[str, dict[str, int]]:
        """The loads of each load budget (by its name: ``max_concurrent_loads``) that this
        process has waiting for a slot (``queued``) and holding one (``running``) now. A
        fleet's are the sum over its processes (the Prometheus and OpenTelemetry gauges
        ``stampede_budget_loads_queued`` and ``_running``)."""
        return self._events.counts.budgets_now()

    def observe(self, observer: Observer) -> None:
        """Report what this layer does to ``observer`` from now on, as well as to its
        counters (``stats()``): a ``stampede.prometheus.PrometheusMetrics``, a
        ``stampede.otel.OpenTelemetryMetrics``, or anything with ``count``, ``began``
        and ``ended`` (``stampede.Observer``), and ``budget`` to hear of load budgets
        (``stampede.BudgetObserver``)."""
        self._events.add(observer)

    def warm(
        self, *loaders: Any, count: int = 1000, concurrency: int = 8, on_progress: Progress | None = None
    ) -> WarmReport:
        """A warm start: call the ``count`` hottest calls of each loader's hot set
        (recorded by ``hot_sample``, in this process or any other) that the cache does
        not hold, from ``concurrency`` threads, hottest first (docs/budgets.md). A
        many-key loader's hottest ids are loaded in pages of ``max_batch``. Each key is
        loaded once across every process warming at the same moment, within the
        loaders' load budgets. ``on_progress(report)`` is told after each call. Returns
        what it did; a call that raised is counted and kept in the report, not raised."""
        return self._hot_sets.warm(loaders, count, concurrency, on_progress)

    async def awarm(
        self, *loaders: Any, count: int = 1000, concurrency: int = 8, on_progress: Progress | None = None
    ) -> WarmReport:
        """``warm`` for ``async def`` loaders, from ``concurrency`` tasks of this loop (the
        hot sets are read in a worker thread)."""
        return await self._hot_sets.awarm(loaders, count, concurrency, on_progress)

    def export_hot_sets(self, *loaders: Any, count: int | None = None) -> dict[str, Any]:
        """The hot sets of ``loaders`` (their ``count`` hottest calls, all by default) as
        JSON-ready data, to keep where a cache server restarted empty, a flush or a new
        namespace cannot reach, and give back with ``import_hot_sets`` (docs/budgets.md).
        Keyed by loader template, not namespace: a new namespace takes an old one's."""
        return self._hot_sets.export(loaders, count)

    def import_hot_sets(self, snapshot: dict[str, Any], *loaders: Any) -> int:
        """Put back what ``export_hot_sets`` gave, for each of ``loaders`` whose hot set is
        empty in the store (so that a fleet booting together imports it once, give or
        take a race), ready for ``warm``. Returns the calls imported. ``ValueError`` for
        data that is not such an export, with nothing imported."""
        return self._hot_sets.import_(snapshot, loaders)

    def flush_hot_sets(self) -> int:
        """Add the calls ``hot_sample`` recorded in this process to their hot sets in the
        store now, rather than within the second a thread of the layer takes. Returns
        how many. (``close()`` does it too.)"""
        return self._hot_sets.recorder.flush()

    def close(self) -> None:
        """Stop the layer's threads and close the connections it opened. Connections of
        async loaders are closed by ``aclose()`` in their event loop."""
        self._hot_sets.recorder.close(REFRESH_CLOSE_TIMEOUT)
        self._parts.watchdog.close()
        self._backend.close_services()
        if self._runner is not None:
            self._runner.refresher.close(REFRESH_CLOSE_TIMEOUT)
            self._runner.verifier.close(REFRESH_CLOSE_TIMEOUT)
            self._runner.store.close()
        if self._async_runner is not None:
            self._async_runner.close()
        self._backend.close_connections()

    async def aclose(self) -> None:
        """``close()`` from a coroutine: also closes this event loop's connections."""
        if self._async_runner is not None:
            await self._async_runner.aclose()
        await asyncio.to_thread(self.close)  # joins the subscriber thread

    def __enter__(self) -> Stampede:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Stampede:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        settings = dataclasses.asdict(self.settings)
        return f"<stampede.Stampede namespace={self.namespace!r} backend={self._backend.name} {settings}>"


_default_layer: Stampede | None = None
_default_lock = threading.Lock()


def default_layer() -> Stampede:
    """The module's layer: over the URL in STAMPEDE_URL (the name the command line and
    the examples read too; STAMPEDE_REDIS_URL, its older name, is still read), else
    embedded, which protects one process only: the layer it made is logged (INFO).
    Connections are opened on first use, so building it at import time is cheap."""
    global _default_layer
    with _default_lock:
        if _default_layer is None:
            name, url = default_url()
            if url:
                _default_layer = Stampede.from_url(url)
                log.info("stampede: the default layer is over %s (from $%s)", redacted(url), name)
            else:
                _default_layer = Stampede()
                log.info(
                    "stampede: the default layer is embedded: it protects this process only "
                    "(set STAMPEDE_URL for protection across processes)"
                )
        return _default_layer


URL_VARIABLES = ("STAMPEDE_URL", "STAMPEDE_REDIS_URL")
"""Where the default layer and the command line find the store's URL, first set first."""


def default_url() -> tuple[str, str | None]:
    """The first of ``URL_VARIABLES`` that is set, and its URL (None: none is set)."""
    for name in URL_VARIABLES:
        url = os.environ.get(name)
        if url:
            return name, url
    return URL_VARIABLES[0], None


@overload
def cached_loader(template: Callable[P, Coroutine[Any, Any, R]], /) -> AsyncCachedLoader[P, R]: ...  # type: ignore[overload-overlap]


@overload
def cached_loader(template: Callable[P, R], /) -> CachedLoader[P, R]: ...


@overload
def cached_loader(
    template: str | None = None,
    *,
    serializer: Serializer | None = None,
    tags: Sequence[str] | None = None,
    verify_equal: Callable[[Any, Any], bool] | None = None,
    version: str | bool | None = None,
    **settings: Unpack[LoaderSettings],
) -> LoaderDecorator: ...


def cached_loader(
    template: str | Callable[..., Any] | None = None,
    *,
    serializer: Serializer | None = None,
    tags: Sequence[str] | None = None,
    verify_equal: Callable[[Any, Any], bool] | None = None,
    version: str | bool | None = None,
    **settings: Unpack[LoaderSettings],
) -> Any:
    """``Stampede.cached_loader`` on the default layer (see ``default_layer``)."""
    given: Any = template  # a template, or the loader itself (``@stampede.cached_loader``)
    return default_layer().cached_loader(
        given, serializer=serializer, tags=tags, verify_equal=verify_equal, version=version, **settings
    )


def cached_loader_many(
    template: str,
    *,
    batch: str | None = None,
    serializer: Serializer | None = None,
    tags: Sequence[str] | None = None,
    verify_equal: Callable[[Any, Any], bool] | None = None,
    version: str | bool | None = None,
    **settings: Unpack[ManyLoaderSettings],
) -> ManyLoaderDecorator:
    """``Stampede.cached_loader_many`` on the default layer (see ``default_layer``)."""
    return default_layer().cached_loader_many(
        template, batch=batch, serializer=serializer, tags=tags, verify_equal=verify_equal, version=version, **settings
    )
