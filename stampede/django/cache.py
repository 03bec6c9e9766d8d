"""``StampedeCache``: Django's cache API over a stampede layer.

Every entry is one cache entry of a loader whose key is Django's own (``make_key``), so
what the decorator promises holds for ``cache.get_or_set``: concurrent misses of one key,
in every thread, task and process, call the default once, and a ``delete`` or ``set``
that returned is never undone by a load that was in flight (the stale-set guard).

* ``get`` and ``has_key`` are ``peek``: no load, no lease.
* ``set`` is the loader's ``set``: it overtakes a load in flight, whose waiters get the
  value set.
* ``add`` and ``get_or_set`` are a call of the loader, whose load writes the value given
  (or the default's result): two ``add`` at once store one value, and tell which.
* ``touch`` is a refresh answering ``NOT_MODIFIED`` with the new timeout: the bytes are
  not rewritten, and a value set meanwhile is not replaced by the one read.
* ``delete`` and ``clear`` invalidate.
* ``incr`` reads and writes under a named lock of the layer, so increments of one key in
  any process are not lost (as Django's base ``incr``, it writes with the default timeout).

Values are pickled, as Django's own backends do: whoever can write to the cache server can
run code in every process that reads it, so the server must be trusted as the database is
(docs/frameworks.md). ``cached_loader`` keeps JSON.

Layers are shared per process: Django makes a backend object per alias and per thread
(and calls ``close`` after every request), while the layer's pool, watchdog and
subscriber are per process. ``close`` leaves it open; it ends with the process.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from .._acached import AsyncCachedLoader
from .._core.config import MAX_SECONDS
from .._core.results import Cached
from .._errors import ConfigError, SerializationError, ValueTooLarge
from .._hosted import Gone, Hosted, Keeper, Producer, hosted, leading, pickled_layer, refuse
from .._layer import Stampede

MANAGED = {"ttl", "null_ttl", "jitter"}
"""Settings Django's TIMEOUT decides: refused in OPTIONS."""

REFUSED = {"stale_while_revalidate", "early_refresh", "tags"}
"""Settings that would load without a caller: a background refresh has no default to call."""


def _layer_for(location: str, options: dict[str, Any]) -> Hosted:
    """The process's layer for ``location`` and ``options``, made on first use."""
    refuse(options, MANAGED, "OPTIONS may not set {}: Django's TIMEOUT decides the lifetimes")
    refuse(options, REFUSED, "OPTIONS may not set {}: a background refresh has no default to call")
    return hosted([location, options], lambda: pickled_layer(location, options, "django"), "django:{key}")


def _ttl(timeout: float | None) -> float | None:
    """A Django timeout as a ttl: None for "expire at once" (0 or less), the longest ttl
    there is for "never" (None)."""
    if timeout is None:
        return MAX_SECONDS
    if timeout <= 0:
        return None
    return min(float(timeout), MAX_SECONDS)


@contextmanager
def _django_errors() -> Iterator[None]:
    """A value pickle refuses raises pickle's own error, which Django's callers catch."""
    try:
        yield
    except SerializationError as error:
        if isinstance(error.__cause__, Exception):
            raise error.__cause__ from None
        raise


@contextmanager
def _leading(producer: Callable[[], Any]) -> Iterator[None]:
    """While a call of the entry's loader runs: a load it leads runs ``producer``."""
    with leading(producer), _django_errors():
        yield


class StampedeCache(BaseCache):  # type: ignore[misc]  # Django ships no types
    """``CACHES = {"default": {"BACKEND": "stampede.django.StampedeCache", "LOCATION":
    "redis://127.0.0.1:6379/0", "OPTIONS": {...}}}``. LOCATION is any URL
    ``Stampede.from_url`` takes (Redis, Sentinel, PostgreSQL) or ``"memory"``; OPTIONS are
    its keyword arguments and settings (``namespace`` defaults to ``"django"``)."""

    def __init__(self, server: str | list[str], params: dict[str, Any]) -> None:
        super().__init__(params)
        if isinstance(server, (list, tuple)):
            if len(server) != 1:
                raise ConfigError(f"StampedeCache takes one LOCATION, got {server!r}")
            server = server[0]
        if not isinstance(server, str) or not server:
            raise ConfigError(f"StampedeCache needs a LOCATION URL (or 'memory'), got {server!r}")
        self._location = server
        self._options = dict(params.get("OPTIONS") or {})
        self._shared: Hosted | None = None

    @property
    def layer(self) -> Stampede:
        """The stampede layer under this cache (shared by every alias with its LOCATION
        and OPTIONS in this process): for ``layer.lock()``, ``stats()``, observers."""
        return self._get_shared().layer

    def _get_shared(self) -> Hosted:
        if self._shared is None:
            self._shared = _layer_for(self._location, self._options)
        return self._shared

    def _async_entry(self) -> AsyncCachedLoader[[str], Any]:
        entry = self._get_shared().aentry
        if entry is None:
            raise ConfigError(f"{self._location!r} has no asyncio client")
        return entry

    def _ttl_of(self, timeout: Any) -> float | None:
        return _ttl(self.default_timeout if timeout is DEFAULT_TIMEOUT else timeout)

    # Reads

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        found = self._get_shared().entry.peek(self.make_and_validate_key(key, version=version))
        return default if found is None else found.value

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        found = await self._async_entry().peek(self.make_and_validate_key(key, version=version))
        return default if found is None else found.value

    def has_key(self, key: Any, version: int | None = None) -> bool:
        return self._get_shared().entry.peek(self.make_and_validate_key(key, version=version)) is not None

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        return await self._async_entry().peek(self.make_and_validate_key(key, version=version)) is not None

    # Loads: one per key at a time, in every process

    def get_or_set(self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> Any:
        made_key = self.make_and_validate_key(key, version=version)
        ttl = self._ttl_of(timeout)
        entry = self._get_shared().entry
        if ttl is None:  # kept by nobody: nothing to share
            found = entry.peek(made_key)
            return found.value if found is not None else (default() if callable(default) else default)
        producer = Producer(default, ttl)
        with _leading(producer):
            try:
                return entry(made_key)
            except ValueTooLarge:
                return producer.uncached()

    async def aget_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> Any:
        made_key = self.make_and_validate_key(key, version=version)
        ttl = self._ttl_of(timeout)
        entry = self._async_entry()
        if ttl is None:
            found = await entry.peek(made_key)
            if found is not None:
                return found.value
            value = default() if callable(default) else default
            return (await value) if inspect.isawaitable(value) else value
        producer = Producer(default, ttl)
        with _leading(producer):
            try:
                return await entry(made_key)
            except ValueTooLarge:
                value = producer.uncached()
                return (await value) if inspect.isawaitable(value) else value

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        made_key = self.make_and_validate_key(key, version=version)
        ttl = self._ttl_of(timeout)
        entry = self._get_shared().entry
        if ttl is None:
            return entry.peek(made_key) is None
        producer = Producer(value, ttl, call=False)
        with _leading(producer):
            try:
                entry(made_key)
            except ValueTooLarge:
                return False  # kept by nobody, as Django's memcached backends answer
        return producer.produced

    async def aadd(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        made_key = self.make_and_validate_key(key, version=version)
        ttl = self._ttl_of(timeout)
        entry = self._async_entry()
        if ttl is None:
            return await entry.peek(made_key) is None
        producer = Producer(value, ttl, call=False)
        with _leading(producer):
            try:
                await entry(made_key)
            except ValueTooLarge:
                return False
        return producer.produced

    # Writes

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> None:
        made_key = self.make_and_validate_key(key, version=version)
        ttl = self._ttl_of(timeout)
        entry = self._get_shared().entry
        if ttl is None:
            entry.invalidate(made_key)
            return
        with _django_errors():
            try:
                entry.set(Cached(value, ttl=ttl), made_key)
            except ValueTooLarge:  # as Django's memcached backends do: the old value goes, nothing fails
                entry.invalidate(made_key)

    async def aset(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> None:
        made_key = self.make_and_validate_key(key, version=version)
        ttl = self._ttl_of(timeout)
        entry = self._async_entry()
        if ttl is None:
            await entry.invalidate(made_key)
            return
        with _django_errors():
            try:
                await entry.set(Cached(value, ttl=ttl), made_key)
            except ValueTooLarge:
                await entry.invalidate(made_key)

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        made_key = self.make_and_validate_key(key, version=version)
        ttl = self._ttl_of(timeout)
        entry = self._get_shared().entry
        if entry.peek(made_key) is None:
            return False
        if ttl is None:
            entry.invalidate(made_key)
            return True
        try:
            with _leading(Keeper(ttl)):
                entry.refresh(made_key)
        except Gone:
            return False
        return True

    async def atouch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        made_key = self.make_and_validate_key(key, version=version)
        ttl = self._ttl_of(timeout)
        entry = self._async_entry()
        if await entry.peek(made_key) is None:
            return False
        if ttl is None:
            await entry.invalidate(made_key)
            return True
        try:
            with _leading(Keeper(ttl)):
                await entry.refresh(made_key)
        except Gone:
            return False
        return True

    def delete(self, key: Any, version: int | None = None) -> bool:
        made_key = self.make_and_validate_key(key, version=version)
        entry = self._get_shared().entry
        existed = entry.peek(made_key) is not None
        entry.invalidate(made_key)
        return existed

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        made_key = self.make_and_validate_key(key, version=version)
        entry = self._async_entry()
        existed = await entry.peek(made_key) is not None
        await entry.invalidate(made_key)
        return existed

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        made_key = self.make_and_validate_key(key, version=version)
        with self._get_shared().layer.lock(f"django-incr:{made_key}"):
            return super().incr(key, delta, version=version)

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        made_key = self.make_and_validate_key(key, version=version)
        async with self._get_shared().layer.lock(f"django-incr:{made_key}"):
            return await super().aincr(key, delta, version=version)

    def clear(self) -> None:
        self._get_shared().layer.clear()

    async def aclear(self) -> None:
        await self._get_shared().layer.aclear()

    def close(self, **kwargs: Any) -> None:
        """Django calls this after every request: the process's layer stays open."""
