"""``Stampede``: a cache layer over one store, and the default layer of the module."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import os
import threading
import typing
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, TypeVar, Union, overload

from ._acached import AsyncCachedLoader, AsyncCachedManyLoader
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
from ._cached import CachedLoader, CachedManyLoader
from ._core.budget import budget_name
from ._core.codec import Codec, Serializer, TypedSerializer
from ._core.config import (
    LOADER_SETTING_NAMES,
    MANY_LOADER_SETTING_NAMES,
    SETTING_NAMES,
    LayerSettings,
    LoaderSettings,
    ManyLoaderSettings,
    Settings,
    check_count,
    check_namespace,
    check_seconds,
    refuse_unknown,
    renamed,
)
from ._core.flow import LoaderSpec
from ._core.hotset import HotSet
from ._core.keys import EntryKeys, KeyBuilder, lock_keys
from ._core.near import NEAR_LEASE
from ._core.observer import Observer
from ._core.patterns import entry_pattern
from ._core.store import AsyncStore, Store
from ._core.tags import TagKeys, TagTemplates, clock_key, tag_name
from ._core.versions import EntryFamily, entry_tag_of, marker_ms, version_of, versions_seen
from ._drivers.abudget import AsyncBudgetSlots, abudgeted
from ._drivers.arunner import AsyncRunner
from ._drivers.budget import BudgetSlots, budgeted
from ._drivers.budgets import Budgets
from ._drivers.hotset import HotSampler, HotSetRecorder
from ._drivers.near import NearCache
from ._drivers.observe import Events, RateLimitedLog
from ._drivers.runner import Runner
from ._drivers.watchdog import LOOP_WATCHDOG, Watchdog
from ._errors import ConfigError
from ._loader import AsyncVersions, P, Versions
from ._loader_many import ManyKeys
from ._lock import Lock, ReentrantHolds
from ._redact import redacted
from ._redlock import Redlock
from ._warm import Progress, WarmReport, awarm, export_hot_sets, import_hot_sets, warm
from .otel.traces import GLOBAL, Tracing

if typing.TYPE_CHECKING:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    from kazoo.client import KazooClient
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider
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
AnyLoader = (
    CachedLoader[Any, Any] | AsyncCachedLoader[Any, Any] | CachedManyLoader[Any, Any] | AsyncCachedManyLoader[Any, Any]
)


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

    ``redlock=Redlock(urls)`` holds every load's lease on a majority of those lock
    servers as well as on the cache server, so no two loads of a key run at once even if
    the cache server loses its keys. Values and messages stay on the cache server (see
    ``_core.majority``). Its servers must be URLs for async loaders.

    ``postgres=`` (a ``postgresql://`` URL or a psycopg_pool ``ConnectionPool``) keeps
    everything in PostgreSQL instead: values, leases, fencing, queues, and wake-ups by
    LISTEN/NOTIFY (``_backends.postgres.schema``). ``zookeeper=`` (hosts, or a started kazoo
    client) holds every load's lease as a ZooKeeper node as well, beside a Redis client:
    a holder's lease ends with its session, and ``layer.lock()`` is ZooKeeper's fair lock.
    See docs/lock-services.md.

    ``backend=`` takes a maker of the whole backend instead (``stampede.backends``): one
    of the families stampede ships (``backends.redis(client)``), or one of your own, which
    the shipped contract suite checks (``stampede.testing.contract``).

    ``tracer_provider=`` traces the layer's calls with that OpenTelemetry provider's
    tracer; without it, with the global provider once the application sets one
    (``stampede.otel.traces``). ``meter_provider=`` records its metrics as that
    provider's instruments (``stampede.otel.OpenTelemetryMetrics``).

    ``near_cache=True`` (a setting, also per loader) serves fresh values from copies in
    this process with no I/O, kept exact across processes by a tracking connection and a
    lease of ``near_lease`` seconds (see ``_core.near`` and docs/near-cache.md). It needs
    a blocking client. ``near_cache_entries`` and
    ``near_cache_bytes`` bound the copies.
    """

    def __init__(
        self,
        client: redis.Redis | None = None,
        *,
        async_client: AsyncClient | None = None,
        redlock: Redlock | None = None,
        namespace: str = "stampede",
        serializer: Serializer | None = None,
        max_entries: int = 10_000,
        background_refreshes: int = 8,
        near_cache_entries: int = 10_000,
        near_cache_bytes: int = 64 * 1024 * 1024,
        near_lease: float = NEAR_LEASE,
        observers: Iterable[Observer] = (),
        postgres: ConnectionPool[Any] | str | None = None,
        zookeeper: KazooClient | str | None = None,
        backend: BackendBuilder | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        **settings: Unpack[LayerSettings],
    ) -> None:
        refuse_unknown(settings, SETTING_NAMES)
        self.settings = Settings(**renamed(settings, stacklevel=2))
        check_count("max_entries", max_entries)
        check_count("background_refreshes", background_refreshes)
        check_count("near_cache_entries", near_cache_entries)
        check_count("near_cache_bytes", near_cache_bytes, 1024)
        if check_seconds("near_lease", near_lease) < 0.01:
            raise ConfigError(f"near_lease must be at least 0.01 s, got {near_lease!r}")
        self._default_names: dict[str, Callable[..., Any]] = {}  # loaders without a template
        self._names_lock = threading.Lock()
        self.namespace = check_namespace(namespace)
        self._codec = Codec(
            serializer,
            compress_above=self.settings.compress_above,
            compression=self.settings.compression,
            max_value_bytes=self.settings.max_value_bytes,
        )
        self._watchdog = Watchdog()
        self._budgets = Budgets(self.namespace, self.settings.max_key_length)
        self._reentrant_holds = ReentrantHolds()
        self._warn = warn = RateLimitedLog(logging.getLogger("stampede.cache"), namespace=self.namespace)
        self._events = events = Events(self.namespace, warn)
        for observer in observers:
            events.add(observer)
        if meter_provider is not None:
            from .otel.metrics import OpenTelemetryMetrics

            events.add(OpenTelemetryMetrics(meter_provider))
        tracing = GLOBAL if tracer_provider is None else Tracing(tracer_provider)
        tracing.ask_now()  # a global provider set before the layer traces its first calls, all of them
        options = BackendOptions(self.namespace, self.settings, max_entries, events.breaker_changed)
        self._backend = built = backend_for(
            options,
            client=client,
            async_client=async_client,
            postgres=postgres,
            redlock=redlock,
            zookeeper=zookeeper,
            backend=backend,
        )
        self._near: NearCache | None = None
        if built.make_tracker is not None:
            self._near = NearCache(near_cache_entries, near_cache_bytes, events, built.start_tracking)
            built.track(self._near, near_lease)
        store, make_async_store = built.store, built.make_async_store
        refreshes = background_refreshes
        policy, servers, make_servers = built.lease_policy, built.lock_servers, built.make_async_lock_servers
        self._runner = (
            Runner(store, events, warn, self._watchdog, refreshes, policy, servers) if store is not None else None
        )
        self._async_runner = (
            AsyncRunner(make_async_store, events, warn, refreshes, policy, make_servers) if make_async_store else None
        )
        for runner in (self._runner, self._async_runner):
            if runner is not None:
                runner.near = self._near
                runner.tracing = tracing
        blocking = self._runner  # not the layer: a layer in a cycle of its own is freed late, by the collector
        self._hot_recorder = HotSetRecorder(lambda: _store_of(blocking), events, warn)
        self._check_near(self.settings)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        socket_connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        namespace: str = "stampede",
        serializer: Serializer | None = None,
        redlock: Redlock | None = None,
        background_refreshes: int = 8,
        check: bool = False,
        cluster: bool = False,
        zookeeper: KazooClient | str | None = None,
        observers: Iterable[Observer] = (),
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        **settings: Unpack[LayerSettings],
    ) -> Stampede:
        """A layer over clients for ``url`` with bounded timeouts and no hidden retries,
        so no call spends longer than wait_timeout plus one socket timeout on Redis.
        ``max_connections`` bounds the pool (one pool for threads, one per event loop
        for async loaders, made when that loop first calls). Callers beyond it wait,
        one socket timeout at most, for a connection instead of failing. ``check=True``
        runs ``check()`` before returning: fail fast on a wrong password or a replica.

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
        opened = open_url(url, Connections(socket_timeout, socket_connect_timeout, max_connections, cluster))
        try:
            layer = cls(
                backend=opened.builder,
                redlock=redlock,
                zookeeper=zookeeper,
                namespace=namespace,
                serializer=serializer,
                background_refreshes=background_refreshes,
                observers=observers,
                tracer_provider=tracer_provider,
                meter_provider=meter_provider,
                **settings,
            )
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
        loader_settings = self.settings.replace(stacklevel=4, **settings)
        self._check_near(loader_settings)
        _check_comparator(verify_equal)
        codec = self._codec_for(serializer, loader_settings)
        if template is not None and not isinstance(template, str):
            if not callable(template):
                raise ConfigError(f"a key template must be a str, got {template!r}")
            return LoaderDecorator(self, None, loader_settings, codec)(template)  # bare @cached_loader
        own_budget = "max_concurrent_loads" in settings
        return LoaderDecorator(self, template, loader_settings, codec, tags, verify_equal, own_budget, version)

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
        loader_settings = self.settings.replace(stacklevel=4, **settings)
        self._check_near(loader_settings)
        _check_comparator(verify_equal)
        if loader_settings.load_timeout or loader_settings.load_soft_timeout:
            raise ConfigError(
                "cached_loader_many does not bound its loads by load_timeout or load_soft_timeout yet: "
                "give load_timeout=0, load_soft_timeout=0 (the layer's apply to cached_loader)"
            )
        codec = self._codec_for(serializer, loader_settings)
        if not isinstance(template, str):
            raise ConfigError(
                f'cached_loader_many takes a key template naming one id\'s entry, e.g. "product:{{product_id}}", '
                f"got {template!r}"
            )
        own_budget = "max_concurrent_loads" in settings
        return ManyLoaderDecorator(
            self, template, batch, loader_settings, codec, tags, verify_equal, own_budget, version
        )

    def _codec_for(self, serializer: Serializer | None, settings: Settings) -> Codec:
        """The layer's codec, or one of ``serializer``, under a loader's ``settings``."""
        codec = self._codec if serializer is None else self._codec.with_serializer(serializer)
        return codec.like(
            compress_above=settings.compress_above,
            compression=settings.compression,
            max_value_bytes=settings.max_value_bytes,
        )

    def _check_near(self, settings: Settings) -> None:
        """Refuse ``near_cache`` where it cannot keep its promise (see docs/near-cache.md).
        The embedded store is in this process already: the setting changes nothing there."""
        backend = self._backend
        if not settings.near_cache or self._near is not None or backend.in_process:
            return
        raise ConfigError(backend.near_refusal or f"near_cache is not available on {backend.name}")

    def _budgeted(self, func: Callable[..., Any], settings: Settings, own: bool, template: str) -> Callable[..., Any]:
        """``func``, or ``func`` holding a slot of its load budget while each call runs
        (``_core.budget``): decided here, at decoration."""
        name = budget_name(self.settings, settings, own, template)
        if name is None:
            return func
        budget, local = self._budgets.get(name, settings)
        store = self._runner.store if self._runner is not None else None
        # An asyncio-only layer's store is made in its event loop: checked at its first load
        # instead (``AsyncBudgetSlots.held``). Otherwise the blocking store answers for both.
        if (store is not None or not _is_async(func)) and not callable(getattr(store, "take_slot", None)):
            raise ConfigError(f"max_concurrent_loads needs a store with load budgets; {self._backend.name} has none")
        if _is_async(func):
            runner = self._async_runner
            assert runner is not None, "an async loader on a layer without an asyncio client is refused before"
            return abudgeted(func, AsyncBudgetSlots(budget, local, runner.loop_store, LOOP_WATCHDOG, self._events))
        assert store is not None
        blocking_store = store
        return budgeted(func, BudgetSlots(budget, local, lambda: blocking_store, self._watchdog, self._events))

    def _claim_name(self, name: str, func: Callable[..., Any]) -> None:
        """Refuse a second loader whose keys, built from ``name``, would be another's."""
        with self._names_lock:
            owner = self._default_names.setdefault(name, func)
        if owner is not func:
            raise ConfigError(
                f"another loader of this layer is already named {name!r} (its keys would be this "
                "one's): give one of them a key template"
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
        return Lock(
            name,
            lock_keys(self.namespace, name, self.settings.max_key_length),
            ttl=self.settings.lock_ttl if ttl is None else ttl,
            blocking=blocking,
            timeout=timeout,
            retry_interval=retry_interval,
            retries=retries,
            renew=renew,
            reentrant=reentrant,
            fair=fair or self._backend.lock_queue is not None,
            recheck_interval=self.settings.recheck_interval,
            store=self._backend.named_lock_store(self._runner.store) if self._runner is not None else None,
            async_store=self._named_lock_async_store if self._async_runner is not None else None,
            watchdog=self._watchdog,
            reentrant_holds=self._reentrant_holds,
        )

    def advisory_lock(self, name: str, *, blocking: bool = True, timeout: float | None = None) -> AdvisoryLock:
        """PostgreSQL's session lock (``pg_advisory_lock``) on a connection of this layer's
        pool, for a layer whose store is PostgreSQL: ``with layer.advisory_lock("job"):``
        or ``async with``. Freed by the database when the holder's session ends. No lease,
        no fencing token (see ``stampede.postgres.AdvisoryLock`` for when it is right)."""
        make = self._backend.advisory_lock
        if make is None:
            raise ConfigError("advisory_lock() needs a layer whose store is PostgreSQL")
        loop_store = self._async_runner.loop_store if self._async_runner is not None else None
        lock: AdvisoryLock = make(self.namespace, name, blocking=blocking, timeout=timeout, loop_store=loop_store)
        return lock

    def _named_lock_async_store(self) -> AsyncStore:
        assert self._async_runner is not None
        store: AsyncStore = self._backend.async_named_lock_store(self._async_runner.loop_store())
        return store

    def _forget(self, key: str) -> None:
        """After an invalidation: callers of every kind in this process read afresh."""
        if self._near is not None:
            self._near.drop([key])
        if self._runner is not None:
            self._runner.forget(key)
        if self._async_runner is not None:
            self._async_runner.forget(key)

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
        match = entry_pattern(pattern, fields)
        store = self._blocking_store("matching", "amatching")
        return sorted(key for key in store.scan(self.namespace, match.glob) if match.matches(key))

    async def amatching(self, pattern: str, **fields: Any) -> list[str]:
        """``matching()`` with this event loop's client."""
        match = entry_pattern(pattern, fields)
        store = self._loop_store("amatching", "matching")
        return sorted(key for key in await store.scan(self.namespace, match.glob) if match.matches(key))

    def invalidate_matching(
        self, pattern: str, /, *, on_progress: Callable[[int, int], object] | None = None, **fields: Any
    ) -> int:
        """Invalidate, as ``invalidate()`` does each one, the entries ``matching(pattern,
        **fields)`` finds. Return how many. Entries written after the scan passed them are
        left alone, as they would be by an invalidation a moment earlier. A pattern that
        names one entry (no wildcard, every field given) invalidates it with no scan, and
        counts 1. ``on_progress(done, found)`` is told after each tenth of the entries
        found (each round trip is one entry's, so 100,000 take a while)."""
        # Each as invalidate() does it: by the layer's lease policy (Redlock's majority first).
        invalidate = self._blocking_runner("invalidate_matching", "ainvalidate_matching").invalidate
        exact = entry_pattern(pattern, fields).exact_key(self.namespace, self.settings.max_key_length)
        keys = [exact] if exact is not None else self.matching(pattern, **fields)
        tell = _every_tenth(on_progress, len(keys))
        for done, value_key in enumerate(keys, 1):
            try:
                with versions_seen() as seen:
                    invalidate(EntryKeys.for_value(value_key))
                for marked in seen:  # an entry a versioned loader marked: every version (``_core.versions``)
                    self._drop_versions(entry_tag_of(marked, self.namespace), False)
            finally:
                self._forget(value_key)
            tell(done)
        return len(keys)

    async def ainvalidate_matching(
        self, pattern: str, /, *, on_progress: Callable[[int, int], object] | None = None, **fields: Any
    ) -> int:
        """``invalidate_matching()`` with this event loop's client."""
        invalidate = self._loop_runner("ainvalidate_matching", "invalidate_matching").invalidate
        exact = entry_pattern(pattern, fields).exact_key(self.namespace, self.settings.max_key_length)
        keys = [exact] if exact is not None else await self.amatching(pattern, **fields)
        tell = _every_tenth(on_progress, len(keys))
        for done, value_key in enumerate(keys, 1):
            try:
                with versions_seen() as seen:
                    await invalidate(EntryKeys.for_value(value_key))
                for marked in seen:
                    await self._adrop_versions(entry_tag_of(marked, self.namespace), False)
            finally:
                self._forget(value_key)
            tell(done)
        return len(keys)

    def invalidate_tag(self, tag: str, **fields: Any) -> int:
        """Invalidate every entry tagged ``tag``, as ``invalidate()`` does each one, and
        keep every load of one that began before this call from writing. ``tag`` is a
        tag as a loader renders it (``"category:7"``), or a tag template whose fields are
        given (``invalidate_tag("category:{id}", id=7)``: escaped as a call's arguments
        are). Once it returns, no caller in any process gets a value those entries held.
        Return how many entries it invalidated. Raises ``BackendUnavailable`` if the
        store fails: call it again (what was done stays done)."""
        clock, keys = self._tag(tag, fields)
        return self._tag_done(
            self._blocking_store("invalidate_tag", "ainvalidate_tag").invalidate_tag(clock, keys, False)
        )

    def expire_tag(self, tag: str, **fields: Any) -> int:
        """The soft ``invalidate_tag``: every entry tagged ``tag`` is stale from now on, as
        ``expire()`` makes one (served stale within its stale window, refreshed by the
        next caller), and no load of one that began before this call writes. Return how
        many entries it expired."""
        clock, keys = self._tag(tag, fields)
        store = self._blocking_store("expire_tag", "aexpire_tag")
        return self._tag_done(store.invalidate_tag(clock, keys, True))

    async def ainvalidate_tag(self, tag: str, **fields: Any) -> int:
        """``invalidate_tag()`` with this event loop's client."""
        clock, keys = self._tag(tag, fields)
        return self._tag_done(
            await self._loop_store("ainvalidate_tag", "invalidate_tag").invalidate_tag(clock, keys, False)
        )

    async def aexpire_tag(self, tag: str, **fields: Any) -> int:
        """``expire_tag()`` with this event loop's client."""
        clock, keys = self._tag(tag, fields)
        store = self._loop_store("aexpire_tag", "expire_tag")
        return self._tag_done(await store.invalidate_tag(clock, keys, True))

    def _tag(self, tag: str, fields: dict[str, Any]) -> tuple[str, TagKeys]:
        """The namespace's tag clock and the keys of the tag named (``InvalidKey`` before
        any I/O for a tag no loader could render)."""
        name = tag_name(tag, fields, self.settings.max_key_length)
        return clock_key(self.namespace), TagKeys.of(self.namespace, name)

    def _drop_versions(self, name: str, soft: bool) -> int:
        """Invalidate (or expire) the entry tag ``name`` every versioned entry of an entry
        carries (``_core.versions``): its entries, in every version, and its loads in flight."""
        store = self._blocking_store("invalidate", "ainvalidate")
        return self._tag_done(store.invalidate_tag(clock_key(self.namespace), TagKeys.of(self.namespace, name), soft))

    async def _adrop_versions(self, name: str, soft: bool) -> int:
        """``_drop_versions`` with this event loop's client."""
        store = self._loop_store("ainvalidate", "invalidate")
        keys = TagKeys.of(self.namespace, name)
        return self._tag_done(await store.invalidate_tag(clock_key(self.namespace), keys, soft))

    def _hot_set(self, loader: AnyLoader, template: str) -> None:
        """Give ``loader`` its hot set (``_core.hotset``), and its sampling of calls into
        it under ``hot_sample``: refused at decoration where the store keeps none."""
        settings = loader.settings
        many = isinstance(loader, (CachedManyLoader, AsyncCachedManyLoader))
        loader.hot_set = HotSet.of(
            self.namespace, template, settings.hot_limit, settings.hot_period, settings.max_key_length, many
        )
        if not settings.hot_sample:
            return
        store = self._runner.store if self._runner is not None else None
        if store is None or not callable(getattr(store, "note_hot", None)):
            raise ConfigError(
                "hot_sample needs a blocking client (Stampede.from_url gives one) and a store that keeps hot "
                f"sets; {self._backend.name} has none"
            )
        loader._hot = HotSampler(loader.hot_set, settings.hot_sample, self._hot_recorder)

    def _tag_done(self, value_keys: list[str]) -> int:
        """After a tag invalidation: callers in this process read its entries afresh."""
        for value_key in value_keys:
            self._forget(value_key)
        self._events.incr("tag_invalidations")
        if value_keys:
            self._events.incr("tag_entries_dropped", len(value_keys))
        return len(value_keys)

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
        return self._blocking_store("store", "loop_store")

    def loop_store(self) -> AsyncStore:
        """``store()`` for the running event loop (each loop has its own)."""
        return self._loop_store("loop_store", "store")

    @property
    def inspector(self) -> Inspector | None:
        """What the command line reads of a shared store (``stampede.cli``), or None when the
        store is not shared (the embedded store lives in one process)."""
        return self._backend.inspector

    def _blocking_runner(self, method: str, twin: str) -> Runner:
        if self._runner is None:
            raise ConfigError(f"{method}() needs a blocking client: use {twin}() in the event loop")
        return self._runner

    def _blocking_store(self, method: str, twin: str) -> Store:
        return self._blocking_runner(method, twin).store

    def _loop_runner(self, method: str, twin: str) -> AsyncRunner:
        if self._async_runner is None:
            raise ConfigError(f"{method}() needs an asyncio client: use {twin}()")
        return self._async_runner

    def _loop_store(self, method: str, twin: str) -> AsyncStore:
        return self._loop_runner(method, twin).loop_store()

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
        store = self._hot_set_store("warm")
        return warm(store, self._events, loaders, count, concurrency, on_progress)

    def export_hot_sets(self, *loaders: Any, count: int | None = None) -> dict[str, Any]:
        """The hot sets of ``loaders`` (their ``count`` hottest calls, all by default) as
        JSON-ready data, to keep where a cache server restarted empty, a flush or a new
        namespace cannot reach, and give back with ``import_hot_sets`` (docs/budgets.md).
        Keyed by loader template, not namespace: a new namespace takes an old one's."""
        return export_hot_sets(self._hot_set_store("export_hot_sets"), loaders, count)

    def import_hot_sets(self, snapshot: dict[str, Any], *loaders: Any) -> int:
        """Put back what ``export_hot_sets`` gave, for each of ``loaders`` whose hot set is
        empty in the store (so that a fleet booting together imports it once, give or
        take a race), ready for ``warm``. Returns the calls imported. ``ValueError`` for
        data that is not such an export, with nothing imported."""
        return import_hot_sets(self._hot_set_store("import_hot_sets"), loaders, snapshot)

    def _hot_set_store(self, method: str) -> Any:
        store = self._runner.store if self._runner is not None else None
        if store is None or not callable(getattr(store, "note_hot", None)):
            raise ConfigError(
                f"{method}() needs a blocking client (Stampede.from_url gives one; hot sets are read and "
                f"recorded through it) and a store that keeps hot sets; {self._backend.name} has none"
            )
        return store

    def flush_hot_sets(self) -> int:
        """Add the calls ``hot_sample`` recorded in this process to their hot sets in the
        store now, rather than within the second a thread of the layer takes. Returns
        how many. (``close()`` does it too.)"""
        return self._hot_recorder.flush()

    async def awarm(
        self, *loaders: Any, count: int = 1000, concurrency: int = 8, on_progress: Progress | None = None
    ) -> WarmReport:
        """``warm`` for ``async def`` loaders, from ``concurrency`` tasks of this loop (the
        hot sets are read in a worker thread)."""
        store = self._hot_set_store("awarm")
        return await awarm(store, self._events, loaders, count, concurrency, on_progress)

    def close(self) -> None:
        """Stop the layer's threads and close the connections it opened. Connections of
        async loaders are closed by ``aclose()`` in their event loop."""
        self._hot_recorder.close(REFRESH_CLOSE_TIMEOUT)
        self._watchdog.close()
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


class LoaderDecorator:
    """What ``cached_loader(...)`` returns: applied to a plain function it makes a
    ``CachedLoader``, to an ``async def`` an ``AsyncCachedLoader``."""

    def __init__(
        self,
        layer: Stampede,
        template: str | None,
        settings: Settings,
        codec: Codec,
        tags: Sequence[str] | None = None,
        verify_equal: Callable[[Any, Any], bool] | None = None,
        own_budget: bool = False,
        version: str | bool | None = None,
    ) -> None:
        self._layer = layer
        self._template = template
        self._settings = settings
        self._codec = codec
        self._tags = tags
        self._verify_equal = verify_equal
        self._own_budget = own_budget  # the loader gave max_concurrent_loads itself
        self._version = version

    @overload
    def __call__(self, func: Callable[P, Coroutine[Any, Any, R]]) -> AsyncCachedLoader[P, R]: ...  # type: ignore[overload-overlap]

    @overload
    def __call__(self, func: Callable[P, R]) -> CachedLoader[P, R]: ...

    def __call__(self, func: Callable[P, Any]) -> CachedLoader[P, Any] | AsyncCachedLoader[P, Any]:
        layer = self._layer
        if isinstance(func, classmethod):
            raise ConfigError(
                f"cached_loader cannot decorate the classmethod {func.__func__.__qualname__}: write "
                "@classmethod above @cached_loader (its first parameter, cls, is then not part of the key)"
            )
        static = isinstance(func, staticmethod)
        if static:
            func = func.__func__  # type: ignore[attr-defined]  # called as it is, from the class or an instance: nothing is bound
        if not callable(func):
            raise ConfigError(f"cached_loader decorates a function, got {func!r}")
        refuse_generator("cached_loader", func)
        longest = self._settings.max_key_length
        version = "" if self._version is None else version_of(self._version, func)
        keys = KeyBuilder(func, self._template, layer.namespace, longest, version=version)
        codec = self._codec
        if isinstance(codec.serializer, TypedSerializer):
            codec = codec.with_serializer(_typed_for(codec.serializer, func))
        tags = None
        entry = KeyBuilder(func, self._template, layer.namespace, longest) if version else None
        if self._tags is not None or version:
            tags = TagTemplates(func, self._tags or [], set(keys.fields), layer.namespace, longest, entry)
        if keys.default_name is not None:
            layer._claim_name(keys.default_name, func)
        if _is_async(func):
            if layer._async_runner is None:
                raise ConfigError(
                    f"{func.__qualname__} is async, and this layer has no asyncio client: "
                    "pass async_client= to Stampede, or use Stampede.from_url"
                )
        elif layer._runner is None:
            raise ConfigError(
                f"{func.__qualname__} is not async, and this layer has only an asyncio client: "
                "pass a blocking client too, or use Stampede.from_url"
            )
        loads = layer._budgeted(func, self._settings, self._own_budget, keys.template)
        spec = LoaderSpec(loads, self._settings, codec, tags, keys.template, self._verify_equal)
        family = None if entry is None else EntryFamily(entry, layer.namespace)
        marks = marker_ms(self._settings) if version else 0
        loader: CachedLoader[P, Any] | AsyncCachedLoader[P, Any]
        if _is_async(func):
            assert layer._async_runner is not None
            aversions = AsyncVersions(layer._adrop_versions, layer.namespace, family, marks)
            loader = AsyncCachedLoader(spec, layer._async_runner, keys, layer._forget, static, aversions)
        else:
            assert layer._runner is not None
            versions = Versions(layer._drop_versions, layer.namespace, family, marks)
            loader = CachedLoader(spec, layer._runner, keys, layer._forget, static, versions)
        layer._hot_set(loader, keys.template)
        return loader


class ManyLoaderDecorator:
    """What ``cached_loader_many(...)`` returns: applied to a plain function it makes a
    ``CachedManyLoader``, to an ``async def`` an ``AsyncCachedManyLoader``."""

    def __init__(
        self,
        layer: Stampede,
        template: str,
        batch: str | None,
        settings: Settings,
        codec: Codec,
        tags: Sequence[str] | None = None,
        verify_equal: Callable[[Any, Any], bool] | None = None,
        own_budget: bool = False,
        version: str | bool | None = None,
    ) -> None:
        self._layer = layer
        self._template = template
        self._batch = batch
        self._version = version
        self._settings = settings
        self._codec = codec
        self._tags = tags
        self._verify_equal = verify_equal
        self._own_budget = own_budget  # the loader gave max_concurrent_loads itself

    def __call__(self, func: Callable[..., Any]) -> Any:
        layer = self._layer
        if isinstance(func, classmethod):
            raise ConfigError(
                f"cached_loader_many cannot decorate the classmethod {func.__func__.__qualname__}: write "
                "@classmethod above @cached_loader_many"
            )
        static = isinstance(func, staticmethod)
        if static:
            func = func.__func__  # type: ignore[attr-defined]
        if not callable(func):
            raise ConfigError(f"cached_loader_many decorates a function, got {func!r}")
        refuse_generator("cached_loader_many", func)
        longest = self._settings.max_key_length
        version = "" if self._version is None else version_of(self._version, func, _value_type(func))
        keys = ManyKeys(func, self._template, self._batch, layer.namespace, longest, version)
        if self._tags is not None or version:
            keys.tag(self._tags or [], layer.namespace, longest)
        codec = self._codec
        if isinstance(codec.serializer, TypedSerializer):
            codec = codec.with_serializer(codec.serializer.for_type(_value_type(func)))
        if _is_async(func):
            if layer._async_runner is None:
                raise ConfigError(f"{func.__qualname__} is async, and this layer has no asyncio client")
        elif layer._runner is None:
            raise ConfigError(f"{func.__qualname__} is not async, and this layer has only an asyncio client")
        loads = layer._budgeted(func, self._settings, self._own_budget, keys.template)
        spec = LoaderSpec(loads, self._settings, codec, None, keys.template, self._verify_equal)
        marks = marker_ms(self._settings) if version else 0
        loader: CachedManyLoader[Any, Any] | AsyncCachedManyLoader[Any, Any]
        if _is_async(func):
            assert layer._async_runner is not None
            adrop = layer._adrop_versions
            loader = AsyncCachedManyLoader(spec, layer._async_runner, keys, layer._forget, static, adrop, marks)
        else:
            assert layer._runner is not None
            drop = layer._drop_versions
            loader = CachedManyLoader(spec, layer._runner, keys, layer._forget, static, drop, marks)
        layer._hot_set(loader, keys.template)
        return loader


def _check_comparator(verify_equal: object) -> None:
    if verify_equal is not None and not callable(verify_equal):
        raise ConfigError(f"verify_equal must be a function of two values returning a bool, got {verify_equal!r}")


def refuse_generator(decorator: str, func: Callable[..., Any]) -> None:
    """A generator function returns before its values are made: there is no one value
    to cache, and an async generator would pass for a blocking loader."""
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        kind = "an async generator" if inspect.isasyncgenfunction(func) else "a generator"
        raise ConfigError(
            f"{decorator} cannot decorate {func.__qualname__}, {kind} function: its values are made while "
            "the caller iterates, after the call returned, so there is no one value to cache. Return a list "
            "(from a def or an async def) instead"
        )


def _every_tenth(on_progress: Callable[[int, int], object] | None, total: int) -> Callable[[int], None]:
    """``tell(done)``, passing ``(done, total)`` on to ``on_progress`` after each tenth of
    ``total`` and at the end."""
    step = max(1, total // 10)

    def tell(done: int) -> None:
        if on_progress is not None and (done % step == 0 or done == total):
            on_progress(done, total)

    return tell


def _typed_for(serializer: TypedSerializer, func: Callable[..., Any]) -> Serializer:
    """``serializer`` for the loader's return annotation (Any if it has none). An
    annotation that cannot be resolved is an error, unless the serializer has its type."""
    try:
        annotation, problem = typing.get_type_hints(func).get("return", Any), None
    except Exception as error:
        annotation, problem = Any, error
    typed = serializer.for_type(annotation)
    if problem is not None and typed is not serializer:
        raise ConfigError(
            f"cannot resolve the return annotation of {getattr(func, '__qualname__', func)!r} ({problem}): "
            "give the serializer its type, e.g. serializer=MsgspecSerializer(Order)"
        )
    return typed


def _store_of(runner: Runner | None) -> Store:
    """The blocking store of a layer's hot sets (refused at decoration without one)."""
    if runner is None:
        raise ConfigError("hot sets need a blocking client")
    return runner.store


def _value_type(func: Callable[..., Any]) -> Any:
    """The value type of a many-key loader's return annotation (``dict[int, Product]``:
    ``Product``), or Any."""
    try:
        annotation = typing.get_type_hints(func).get("return", Any)
    except Exception:
        return Any
    arguments = typing.get_args(annotation)
    return arguments[1] if len(arguments) == 2 else Any


def _is_async(func: Callable[..., Any]) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


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
