"""Litestar stores over a stampede layer: ``StampedeStore`` is a Litestar ``Store`` (the
API its response cache, server-side sessions and rate limiting keep their data in), and
``StampedePlugin`` puts every store of an app on the layer, with a response cache whose
concurrent misses of one URL, in every worker process, run the handler once.

    from stampede.litestar import StampedePlugin

    layer = Stampede.from_url("redis://127.0.0.1:6379/0")
    app = Litestar([products], plugins=[StampedePlugin(layer)])

    @get("/products/{product_id:int}", cache=60)
    async def products(product_id: int) -> dict: ...

How the response cache collapses: Litestar asks its store for a cached route's key
before the handler runs, and gives it the response once sent. ``StampedePlugin``'s store
answers a miss by loading the key through the layer. The request whose load leads runs
the handler; its ``set`` hands the response to the load, which writes it and wakes the
requests that waited (in this process and the others), and they answer with it. A
response Litestar does not keep (its ``cache_response_filter`` refused the status, or
the handler failed) is handed to nobody: each waiting request then runs the handler
itself. A request that leads and goes away refuses its load as it goes.

What the store's calls mean, on every backend: ``set`` overtakes a load of its key in
flight (in any process); ``delete`` and ``delete_all`` are never undone by one; ``get``
reads with no lease; ``renew_for`` keeps a value with an expiry longer. A namespace is
a key prefix, and ``with_namespace`` a child namespace that ``delete_all`` of its parent
empties too (as Litestar's ``RedisStore``). ``expires_in`` is told by the writer's
clock. Litestar's response cache keys a response by method, path and query alone: a
cached route's response is everyone's, as it is over Litestar's own stores.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import re
import struct
import threading
import time
import weakref
from datetime import timedelta
from typing import Any

from litestar.config.app import AppConfig
from litestar.enums import ScopeType
from litestar.plugins import InitPluginProtocol
from litestar.stores.base import NamespacedStore, Store
from litestar.stores.registry import StoreRegistry
from litestar.types import ASGIApp, Receive, Scope, Send

from ._acached import AsyncCachedLoader
from ._core.config import MAX_SECONDS
from ._core.results import Cached, previous
from ._errors import ConfigError, ValueTooLarge
from ._hosted import Gone, Lead, NotKept, aproduce, leading
from ._layer import Stampede

_NAMESPACE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NO_EXPIRY = struct.pack("<d", math.nan)
_NO_BACKGROUND: dict[str, Any] = {
    "stale_while_revalidate": 0.0,
    "stale_if_error": 0.0,
    "early_refresh": 0.0,
    "verify_sample": 0.0,
}
"""A store's loads run only when a caller leads them: a background refresh or
verification would have no response to load."""


class _StoredBytes:
    """A store's value and when it expires (wall clock seconds, or None), as 8 bytes of
    expiry then the value: no pickle, so the server's data runs no code here."""

    @staticmethod
    def dumps(stored: tuple[bytes, float | None]) -> bytes:
        data, expires_at = stored
        return (_NO_EXPIRY if expires_at is None else struct.pack("<d", expires_at)) + data

    @staticmethod
    def loads(raw: bytes) -> tuple[bytes, float | None]:
        (expires_at,) = struct.unpack_from("<d", raw)
        return bytes(raw[8:]), None if math.isnan(expires_at) else expires_at


async def _given(namespace: str, key: str) -> Any:
    """The loader of every entry: what the caller leading its load gave (a renewal, or
    the response of the request that leads)."""
    return await aproduce(key)


_entries: weakref.WeakKeyDictionary[Stampede, AsyncCachedLoader[[str, str], Any]] = weakref.WeakKeyDictionary()
_entries_lock = threading.Lock()


def _entry(layer: Stampede) -> AsyncCachedLoader[[str, str], Any]:
    """The layer's loader of store entries (one per layer, whatever the stores over it)."""
    if not layer.serves_async:
        raise ConfigError("stampede.litestar needs a layer with an asyncio client (Stampede.from_url makes one)")
    if layer.settings.jitter:
        raise ConfigError("a Litestar store's values expire when they are told to: give it a layer made with jitter=0")
    with _entries_lock:
        found = _entries.get(layer)
        if found is None:
            decorate = layer.cached_loader("litestar:{namespace}:{key}", serializer=_StoredBytes(), **_NO_BACKGROUND)
            found = _entries[layer] = decorate(_given)
        return found


def _seconds(expires_in: int | float | timedelta | None) -> float | None:
    """Litestar's expiry as seconds: None (or 0) for none."""
    seconds = expires_in.total_seconds() if isinstance(expires_in, timedelta) else expires_in
    if seconds is None or seconds == 0:
        return None
    if seconds < 0:
        raise ValueError(f"expires_in must be >= 0 seconds, got {expires_in!r}")
    return min(float(seconds), MAX_SECONDS)


class _Lead(Lead):
    """A response cache's load a request leads: the response ``set`` gives, with the
    expiry it names."""

    def cached(self, response: tuple[bytes, float | None]) -> Cached[tuple[bytes, float | None]]:
        data, seconds = response
        return Cached((data, None if seconds is None else time.time() + seconds), ttl=seconds or MAX_SECONDS)


class _Renewal:
    """What a renewing ``get`` loads: the value it renews, expiring ``seconds`` from now."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self) -> Cached[tuple[bytes, float | None]]:
        found = previous()
        if found is None:
            raise Gone
        data, _ = found.value
        return Cached((data, time.time() + self.seconds), ttl=self.seconds)


_leads: contextvars.ContextVar[dict[tuple[str, str], _Lead] | None] = contextvars.ContextVar(
    "stampede_litestar_leads", default=None
)
"""The loads the request under way leads, by entry (set by ``StampedePlugin``'s middleware)."""


class StampedeStore(NamespacedStore):
    """A Litestar ``Store`` over ``layer`` (one with an asyncio client), its keys prefixed
    by ``namespace`` (letters, digits, ``_.-``). ``collapse``: a miss inside a request
    leads or joins a load of its key (the response cache's store; ``StampedePlugin``
    makes it, with the middleware that ends each lead)."""

    __slots__ = ("_collapse", "_entry", "layer")

    def __init__(self, layer: Stampede, namespace: str = "LITESTAR", *, collapse: bool = False) -> None:
        if not isinstance(namespace, str) or _NAMESPACE.fullmatch(namespace) is None:
            raise ConfigError(
                f"a StampedeStore namespace is 1 to 64 letters, digits, '_', '.' or '-', got {namespace!r}"
            )
        self.layer = layer
        self.namespace = namespace
        self._collapse = collapse
        self._entry = _entry(layer)

    def with_namespace(self, namespace: str) -> StampedeStore:
        """A store in the child namespace ``namespace`` (emptied by this one's ``delete_all``)."""
        return type(self)(self.layer, f"{self.namespace}_{namespace}", collapse=self._collapse)

    async def set(self, key: str, value: str | bytes, expires_in: int | timedelta | None = None) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        seconds = _seconds(expires_in)
        leads = _leads.get()
        lead = None if leads is None else leads.pop((self.namespace, key), None)
        if lead is not None and lead.load is not None and not lead.response.done():
            lead.response.set_result((data, seconds))
            await asyncio.wait({lead.load})  # written (or refused) before the response ends
            return
        expires_at = None if seconds is None else time.time() + seconds
        try:
            await self._entry.set(Cached((data, expires_at), ttl=seconds or MAX_SECONDS), self.namespace, key)
        except ValueTooLarge:  # as a memcached store does: the old value goes, nothing fails
            await self._entry.invalidate(self.namespace, key)

    async def get(self, key: str, renew_for: int | timedelta | None = None) -> bytes | None:
        leads = _leads.get() if self._collapse else None
        if leads is not None:
            return await self._lead_or_wait(key, leads)
        found = await self._entry.peek(self.namespace, key)
        if found is None:
            return None
        data, expires_at = found.value
        seconds = _seconds(renew_for)
        if seconds is None or expires_at is None:
            return data  # type: ignore[no-any-return]
        try:
            with leading(_Renewal(seconds)):
                data, _ = await self._entry.refresh(self.namespace, key)
        except Gone:
            return None
        return data  # type: ignore[no-any-return]

    async def _lead_or_wait(self, key: str, leads: dict[tuple[str, str], _Lead]) -> bytes | None:
        """The kept response, once read or loaded by another request; or None, and this
        request leads the load (its ``set`` gives the response), or runs the handler
        itself (the leader's response was not kept)."""
        lead = _Lead()
        if await lead.lead_or_join(lambda: self._entry(self.namespace, key)):
            earlier = leads.pop((self.namespace, key), None)
            if earlier is not None:
                earlier.refuse()
            leads[(self.namespace, key)] = lead
            return None
        try:
            assert lead.load is not None
            data, _ = lead.load.result()
        except (NotKept, ValueTooLarge):
            return None
        return data  # type: ignore[no-any-return]

    async def delete(self, key: str) -> None:
        await self._entry.invalidate(self.namespace, key)

    async def delete_all(self) -> None:
        """Invalidate every value of this namespace and of its children."""
        for glob in (f"litestar:{self.namespace}:*", f"litestar:{self.namespace}_*"):
            await self.layer.ainvalidate_matching(glob)

    async def exists(self, key: str) -> bool:
        return await self._entry.peek(self.namespace, key) is not None

    async def expires_in(self, key: str) -> int | None:
        found = await self._entry.peek(self.namespace, key)
        if found is None or found.value[1] is None:
            return None
        return max(0, int(found.value[1] - time.time()))


class _EndLeads:
    """The middleware: a request's leads it did not give a response to are refused as it
    ends, so that the requests waiting on them run the handler themselves."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        leads: dict[tuple[str, str], _Lead] = {}
        token = _leads.set(leads)
        try:
            await self.app(scope, receive, send)
        finally:
            _leads.reset(token)
            for lead in leads.values():
                lead.refuse()


class StampedePlugin(InitPluginProtocol):
    """Every store of the app (its response cache, sessions, rate limits, and any named
    ``app.stores.get(name)``) on ``layer``, each in the namespace of its name under
    ``namespace``; the response cache's store (``response_cache``, or the name the app's
    ``ResponseCacheConfig`` gives) collapses concurrent misses. Stores the app names
    itself are kept as they are."""

    def __init__(self, layer: Stampede, *, namespace: str = "LITESTAR") -> None:
        self.root = StampedeStore(layer, namespace)

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        response_store = app_config.response_cache_config.store
        given = app_config.stores
        if isinstance(given, StoreRegistry):
            raise ConfigError("StampedePlugin makes the app's store registry: give it stores as a dict, not a registry")
        root = self.root

        def make(name: str) -> Store:
            return StampedeStore(root.layer, f"{root.namespace}_{name}", collapse=name == response_store)

        app_config.stores = StoreRegistry(dict(given or {}), default_factory=make)
        app_config.middleware.insert(0, _EndLeads)
        return app_config
