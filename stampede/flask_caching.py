"""Flask-Caching over a stampede layer: ``@cache.cached`` and ``@cache.memoize`` whose
misses of one key, in every thread and process, call the view or function once.

    from stampede.flask_caching import Cache

    app.config.update(CACHE_TYPE="stampede.flask_caching.StampedeCache",
                      CACHE_STAMPEDE_URL="redis://127.0.0.1:6379/0")
    cache = Cache(app)

* ``StampedeCache`` is the cache type: Flask-Caching's backend API (``get``, ``set``,
  ``add``, ``delete``, ``has``, ``inc``, ``clear``, and the many-key forms) over a layer,
  with the meaning the Django backend gives them (``stampede.django``): ``get`` and
  ``has`` read without a lease, ``set`` overtakes a load in flight, two ``add`` at once
  store one value, ``delete`` and ``clear`` invalidate, ``inc`` is not lost under a
  named lock. Values are pickled, as Flask-Caching's own backends do (the server must be
  trusted as the database is).
* ``Cache`` is ``flask_caching.Cache`` whose decorators collapse: a decorated call that
  misses loads its key through the layer, so the callers missing it at once wait for the
  one that runs the function and get its value; the decorator's ``set`` of that value
  is then already done. Everything else (keys, ``unless``, ``forced_update``,
  ``response_filter``, ``delete_memoized``, signals) is Flask-Caching's own. Over any
  other cache type, ``Cache`` refuses to start (``ConfigError``): its collapse needs the
  layer.

``CACHE_STAMPEDE_URL`` is any URL ``Stampede.from_url`` takes (or ``"memory"``, a layer in
this process); ``CACHE_STAMPEDE_OPTIONS`` its settings (``namespace`` defaults to
``"flask"``); ``CACHE_DEFAULT_TIMEOUT`` and ``CACHE_KEY_PREFIX`` mean what they mean for
every type. A timeout of 0 keeps a value until it is deleted.
"""

from __future__ import annotations

import contextvars
import datetime
import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flask_caching
from flask import Flask
from flask_caching.backends.base import BaseCache
from flask_caching.utils import function_namespace, join_generator
from werkzeug.exceptions import HTTPException

from ._core.config import MAX_SECONDS
from ._core.results import Cached
from ._errors import ConfigError, ValueTooLarge
from ._hosted import Gone, Hosted, Keeper, Producer, hosted, leading, pickled_layer, refuse
from ._layer import Stampede

MANAGED = {"ttl", "null_ttl", "jitter", "serializer"}
"""Settings Flask-Caching's timeouts and pickling decide: refused in CACHE_STAMPEDE_OPTIONS."""

REFUSED = {"stale_while_revalidate", "early_refresh", "tags"}
"""Settings that would load without a caller: a background refresh has no view to call."""


def _layer_for(url: str, options: dict[str, Any]) -> Hosted:
    refuse(options, MANAGED, "CACHE_STAMPEDE_OPTIONS may not set {}: Flask-Caching decides them")
    refuse(options, REFUSED, "CACHE_STAMPEDE_OPTIONS may not set {}: a background refresh has no view to call")
    return hosted([url, options], lambda: pickled_layer(url, options, "flask"), "flask:{key}")


class StampedeCache(BaseCache):
    """The cache type (``CACHE_TYPE="stampede.flask_caching.StampedeCache"``), or made by
    hand: ``StampedeCache("redis://127.0.0.1:6379/0", default_timeout=300)``."""

    def __init__(
        self,
        url: str,
        default_timeout: int = 300,
        key_prefix: str | Callable[[], str] = "",
        options: dict[str, Any] | None = None,
        ignore_delete_many_errors: bool = False,
    ) -> None:
        super().__init__(default_timeout=default_timeout, ignore_delete_many_errors=ignore_delete_many_errors)
        if not isinstance(url, str) or not url:
            raise ConfigError(f"StampedeCache needs CACHE_STAMPEDE_URL (a URL, or 'memory'), got {url!r}")
        self.key_prefix = key_prefix
        self._hosted = _layer_for(url, dict(options or {}))

    @classmethod
    def factory(cls, app: Flask, config: dict[str, Any], args: list[Any], kwargs: dict[str, Any]) -> StampedeCache:
        settings = {**kwargs, "key_prefix": config.get("CACHE_KEY_PREFIX") or ""}
        settings["options"] = config.get("CACHE_STAMPEDE_OPTIONS")
        return cls(config.get("CACHE_STAMPEDE_URL") or "", *args, **settings)

    @property
    def layer(self) -> Stampede:
        """The layer under this cache (for ``layer.lock()``, ``stats()``, observers)."""
        return self._hosted.layer

    def _key(self, key: str) -> str:
        prefix = self.key_prefix() if callable(self.key_prefix) else self.key_prefix
        return f"{prefix}{key}"

    def _ttl(self, timeout: int | datetime.timedelta | None) -> float | None:
        """Flask-Caching's timeout as a ttl: the default for None, the longest there is for
        0 ("never expires"), None (nothing kept) for less than 0."""
        seconds = self._normalize_timeout(timeout)
        if seconds == 0:
            return MAX_SECONDS
        return None if seconds < 0 else min(float(seconds), MAX_SECONDS)

    # Reads: no lease, no load

    def get(self, key: str) -> Any:
        return self.find(key)[1]

    def find(self, key: str) -> tuple[bool, Any]:
        """Whether a value is kept for ``key`` (None is one, when kept), and the value."""
        found = self._hosted.entry.peek(self._key(key))
        return (False, None) if found is None else (True, found.value)

    def has(self, key: str) -> bool:
        return self.find(key)[0]

    # Loads: one per key at a time, in every process

    def add(self, key: str, value: Any, timeout: int | datetime.timedelta | None = None) -> bool:
        ttl = self._ttl(timeout)
        if ttl is None:
            return not self.has(key)
        producer = Producer(value, ttl, call=False)
        with leading(producer):
            try:
                self._hosted.entry(self._key(key))
            except ValueTooLarge:
                return False
        return producer.produced

    def load(self, key: str, produce: Callable[[], Any], timeout: int | datetime.timedelta | None, *,
             again: bool = False, keep: Callable[[Any], bool] = lambda value: True) -> tuple[Any, bool]:  # fmt: skip
        """``produce()``'s value for ``key``, kept for ``timeout``, called by one caller
        of the key at a time in every process; the others get its value. ``again``: load
        even if a value is kept (it was found stale, or None that is not to be served);
        ``keep``: whether a value is kept (else only the callers of this load get it).
        Returns the value, and whether this caller's ``produce`` made it."""
        ttl = self._ttl(timeout)
        if ttl is None:
            return produce(), True
        producer = _Produced(produce, ttl, keep)
        entry = self._hosted.entry
        with leading(producer):
            try:
                value = entry.refresh(self._key(key)) if again else entry(self._key(key))
            except ValueTooLarge:
                value = producer.uncached()
        return value, producer.produced

    def touch(self, key: str, timeout: int | datetime.timedelta | None = None) -> bool:
        """Keep ``key``'s value ``timeout`` longer without rewriting it (a reader meanwhile
        finds it, as it would not while a ``set`` writes over it); False if none is kept."""
        ttl = self._ttl(timeout)
        if not self.has(key):
            return False
        if ttl is None:
            self._hosted.entry.invalidate(self._key(key))
            return True
        try:
            with leading(Keeper(ttl)):
                self._hosted.entry.refresh(self._key(key))
        except Gone:
            return False
        return True

    # Writes

    def set(self, key: str, value: Any, timeout: int | datetime.timedelta | None = None) -> bool:
        ttl = self._ttl(timeout)
        entry = self._hosted.entry
        if ttl is None:
            entry.invalidate(self._key(key))
            return True
        try:
            entry.set(Cached(value, ttl=ttl), self._key(key))
        except ValueTooLarge:  # as a memcached backend does: the old value goes, nothing fails
            entry.invalidate(self._key(key))
            return False
        return True

    def delete(self, key: str) -> bool:
        existed = self.has(key)
        self._hosted.entry.invalidate(self._key(key))
        return existed

    def inc(self, key: str, delta: int = 1) -> int | None:
        with self.layer.lock(f"flask-inc:{self._key(key)}"):
            value = (self.get(key) or 0) + delta
            return value if self.set(key, value) else None

    def dec(self, key: str, delta: int = 1) -> int | None:
        return self.inc(key, -delta)

    def clear(self) -> bool:
        self.layer.clear()
        return True


@dataclass(frozen=True)
class _Keep:
    """Which of a decorated function's values its decorator keeps: None only with
    ``cache_none``, and what ``response_filter`` accepts (given a view's exception as
    its response, as ``cached`` gives it)."""

    none: bool = True
    response_filter: Callable[[Any], Any] | None = None
    response: bool = False

    def __call__(self, value: Any) -> bool:
        if value is None and not self.none:
            return False
        if self.response_filter is None:
            return True
        return bool(
            self.response_filter(value.get_response() if self.response and isinstance(value, HTTPException) else value)
        )


class _Produced(Producer):
    """A decorated call's load: its function's value, kept if its decorator would keep it
    (its waiters get it either way)."""

    __slots__ = ("keep",)

    def __init__(self, produce: Callable[[], Any], ttl: float, keep: Callable[[Any], bool]) -> None:
        super().__init__(produce, ttl)
        self.keep = keep

    def cached(self, value: Any) -> Cached[Any]:
        if inspect.isgenerator(value):  # a streamed view: kept whole, as Flask-Caching keeps it
            value = self.value = join_generator(value)
        timeout = getattr(value, "timeout", None)  # a CachedResponse names its own
        ttl = min(float(timeout), MAX_SECONDS) if isinstance(timeout, (int, float)) and timeout > 0 else self.ttl
        return Cached(value, ttl=ttl, store=self.keep(value))


@dataclass
class _Call:
    """One decorated call under way: the function, the key its decorator read (once it
    has), whether a value was kept there, the key its load wrote (until the decorator's
    set of it, then done), and whether its own function made the value."""

    function: Callable[..., Any]
    key: str | None = None
    found: bool = False
    loaded: str | None = None
    led: bool = False  # its own function made the value (the others of its load waited)


_calling: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("stampede_flask_call", default=None)


def _renews() -> bool:
    """Whether a memoized call renews its function's version after its value was set:
    the one whose function made the value does (or a call outside a decorated one); the
    64 that waited for it need not touch it again."""
    call = _calling.get()
    return call is None or call.led


@dataclass
class _Decorated:
    """What a decorator said of its function: the decorated function (whose
    ``cache_timeout`` a user may change after) and which values are kept."""

    decorated: Any
    keep: _Keep


class Cache(flask_caching.Cache):
    """``flask_caching.Cache`` whose ``cached`` and ``memoize`` collapse their misses
    through the layer of a ``StampedeCache`` (the module's docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._decorated: weakref.WeakKeyDictionary[Callable[..., Any], _Decorated] = weakref.WeakKeyDictionary()
        super().__init__(*args, **kwargs)

    def init_app(self, app: Flask, config: dict[str, Any] | None = None) -> None:
        super().init_app(app, config)
        backend = app.extensions["cache"][self]
        if not isinstance(backend, StampedeCache):
            raise ConfigError(
                f"stampede.flask_caching.Cache needs CACHE_TYPE='stampede.flask_caching.StampedeCache', "
                f"got a {type(backend).__name__}: its decorators collapse misses through the layer"
            )

    def cached(self, *args: Any, **kwargs: Any) -> Any:
        said = inspect.signature(flask_caching.Cache.cached).bind(self, *args, **kwargs)
        return self._noting(super().cached(*args, **kwargs), said, response=True)

    def memoize(self, *args: Any, **kwargs: Any) -> Any:
        said = inspect.signature(flask_caching.Cache.memoize).bind(self, *args, **kwargs)
        return self._noting(super().memoize(*args, **kwargs), said, response=False)

    def _noting(
        self, decorate: Callable[[Callable[..., Any]], Any], said: inspect.BoundArguments, response: bool
    ) -> Any:
        said.apply_defaults()
        keep = _Keep(bool(said.arguments["cache_none"]), said.arguments["response_filter"], response)

        def decorator(function: Callable[..., Any]) -> Any:
            decorated = decorate(function)
            self._decorated[function] = _Decorated(decorated, keep)
            return decorated

        return decorator

    def _memoize_version(
        self,
        f: Callable[..., Any],
        args: Any | None = None,
        kwargs: dict[str, Any] | None = None,
        reset: bool = False,
        delete: bool = False,
        refresh: bool = False,
        timeout: int | None = flask_caching.VERSION_TIMEOUT,
        args_to_ignore: list[str] | None = None,
    ) -> tuple[str, str] | tuple[str, None]:
        """A memoized function's version (a part of its keys), made by one caller when
        it is missing, not by each: Flask-Caching's callers of a cold function each make
        one and write it, so that each has keys of its own, and each loads. Here a missing
        version is added (two ``add`` at once keep one) and read back, and a version's
        life is renewed by ``touch``, not rewritten (a reader of a version being written
        over finds none, and makes a new one)."""
        if reset or delete:
            return super()._memoize_version(f, args, kwargs, reset, delete, refresh, timeout, args_to_ignore)
        fname, instance_fname = function_namespace(f, args=args)
        keys = [self._memvname(fname)]
        if instance_fname and "self" not in (args_to_ignore or []):
            keys.append(self._memvname(instance_fname))
        backend: StampedeCache = self.cache  # type: ignore[assignment]  # init_app made sure
        versions = list(self.get_many(*keys))
        for index, (key, version) in enumerate(zip(keys, versions, strict=True)):
            if version is None:
                backend.add(key, self._memoize_make_version_hash(), timeout=timeout)
                versions[index] = backend.get(key)
            elif refresh and _renews():  # its life follows its newest entry's: kept, not rewritten
                backend.touch(key, timeout=timeout)
        if None in versions:  # deleted meanwhile: Flask-Caching's own way
            return super()._memoize_version(f, args, kwargs, reset, delete, refresh, timeout, args_to_ignore)
        return fname, "".join(versions)

    # Both decorators begin each call with _bypass_cache, read their key with get, call
    # the function with _call_fn on a miss, and set what it returned: the call is noted
    # at the first, its key at the second, the load made at the third, and the fourth
    # finds it done.

    def _bypass_cache(self, unless: Any, f: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        bypass = bool(super()._bypass_cache(unless, f, *args, **kwargs))
        _calling.set(None if bypass else _Call(f))
        return bypass

    def get(self, key: str) -> Any:
        call = _calling.get()
        if call is None or call.key is not None:
            return super().get(key)
        backend: StampedeCache = self.cache  # type: ignore[assignment]  # init_app made sure
        # One read tells both: a has() after it could find the value a load wrote since,
        # and load again what it should have waited for.
        call.found, value = backend.find(key)
        call.key = key
        return value

    def _call_fn(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        call = _calling.get()
        noted = self._decorated.get(fn)
        if call is None or call.function is not fn or call.key is None or noted is None:
            return super()._call_fn(fn, *args, **kwargs)  # bypassed, forced, or not ours
        _calling.set(None)  # the function's own decorated calls note theirs
        key, timeout = call.key, noted.decorated.cache_timeout
        backend: StampedeCache = self.cache  # type: ignore[assignment]  # init_app made sure
        value, call.led = backend.load(key, lambda: super(Cache, self)._call_fn(fn, *args, **kwargs), timeout,
                                       again=call.found, keep=noted.keep)  # fmt: skip
        if value is None or noted.keep(value):  # the decorator sets what it keeps (and None): done
            call.loaded = key
        _calling.set(call)
        return value

    def set(self, key: str, value: Any, timeout: Any = None) -> Any:
        call = _calling.get()
        if call is not None and call.loaded == key:
            call.loaded = None
            return True  # the load wrote it
        return super().set(key, value, timeout=timeout)
