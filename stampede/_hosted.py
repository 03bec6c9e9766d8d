"""A host framework's cache API over a layer (Django's cache, Flask-Caching): every entry
is a cache entry of one loader keyed by the host's own key, whose load runs what the
caller leading it gave (``get_or_set``'s default, ``add``'s value, a decorated view). So
the host's callers of one cold key, in every thread, task and process, load it once, and
a ``delete`` or ``set`` that returned is never undone by a load that was in flight.

The layer is shared per process and per location and settings: hosts make a cache
object per alias, per thread or per app, while a layer's pool, watchdog and subscriber
belong to the process."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import threading
from collections.abc import Awaitable, Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ._acached import AsyncCachedLoader
from ._cached import CachedLoader
from ._core.pickle_serializer import PickleSerializer
from ._core.results import NOT_MODIFIED, Cached, previous
from ._errors import ConfigError
from ._layer import Stampede

MEMORY = "memory"
"""The location of a layer in this process's memory (tests, one-process development)."""

_producing: contextvars.ContextVar[Callable[[], Any] | None] = contextvars.ContextVar(
    "stampede_hosted_producing", default=None
)


class Gone(Exception):
    """A touch found nothing to keep: the entry went between its peek and its lease."""


def _produce(key: str) -> Any:
    """The loader of every entry: it runs what the caller that leads the load gave."""
    make = _producing.get()
    if make is None:
        raise RuntimeError(f"{key!r} was loaded with nothing to produce its value")
    return make()


async def aproduce(key: str) -> Any:
    """``_produce``, awaiting a default that is a coroutine function."""
    result = _produce(key)
    return (await result) if inspect.isawaitable(result) else result


@contextmanager
def leading(producer: Callable[[], Any]) -> Iterator[None]:
    """While a call of the entry's loader runs: a load it leads runs ``producer``."""
    token = _producing.set(producer)
    try:
        yield
    finally:
        _producing.reset(token)


@dataclass
class Hosted:
    """One process's layer for one location and settings, and its two loaders."""

    layer: Stampede
    entry: CachedLoader[[str], Any]
    aentry: AsyncCachedLoader[[str], Any] | None


_hosted: dict[str, Hosted] = {}
_hosted_lock = threading.Lock()


def hosted(identity: Any, make_layer: Callable[[], Stampede], template: str) -> Hosted:
    """The process's layer for ``identity`` (JSON-able: its location and settings), made
    by ``make_layer`` on first use, with loaders of ``template`` (one ``{key}``)."""
    name = json.dumps([template, identity], sort_keys=True, default=repr)
    with _hosted_lock:
        found = _hosted.get(name)
        if found is not None:
            return found
        layer = make_layer()
        entry = layer.cached_loader(template)(_produce)
        aentry = layer.cached_loader(template)(aproduce) if layer.serves_async else None
        made = _hosted[name] = Hosted(layer, entry, aentry)
        return made


def refuse(options: Collection[str], names: Collection[str], why: str) -> None:
    """A ``ConfigError`` if ``options`` set any of ``names``: ``why`` with ``{}`` for them."""
    found = sorted(set(names) & set(options))
    if found:
        raise ConfigError(why.format(", ".join(found)))


def pickled_layer(location: str, options: dict[str, Any], namespace: str) -> Stampede:
    """A layer at ``location`` (a URL ``Stampede.from_url`` takes, or ``MEMORY``) whose
    values are pickled, as the hosts' own backends pickle them, with no jitter: the
    host's timeout is the value's life."""
    settings = {"namespace": namespace, **options, "jitter": 0.0, "serializer": PickleSerializer()}
    return Stampede(**settings) if location == MEMORY else Stampede.from_url(location, **settings)


class Producer:
    """What a load of ``get_or_set`` or ``add`` writes: ``default`` (called, if it is
    callable and ``call``) for ``ttl`` seconds. ``produced`` tells the caller whether its
    own value was the one loaded."""

    __slots__ = ("call", "default", "produced", "ttl", "value")

    def __init__(self, default: Any, ttl: float, call: bool = True) -> None:
        self.default = default
        self.ttl = ttl
        self.call = call
        self.produced = False
        self.value: Any = None

    def __call__(self) -> Any:
        value = self.default() if self.call and callable(self.default) else self.default
        self.produced = True
        self.value = value
        if inspect.isawaitable(value):
            return self._settled(value)
        return self.cached(value)

    def cached(self, value: Any) -> Cached[Any]:
        """How ``value`` is kept (a host may keep some values apart)."""
        return Cached(value, ttl=self.ttl)

    async def _settled(self, value: Any) -> Cached[Any]:
        self.value = await value
        return self.cached(self.value)

    def uncached(self) -> Any:
        """The value for a caller whose value was too large to keep (over
        ``max_value_bytes``): its own, if it loaded one, else the default's, uncached, as
        Django's memcached backends serve a page they cannot keep."""
        if self.produced:
            return self.value
        return self.default() if self.call and callable(self.default) else self.default


class Keeper:
    """What a ``touch`` loads: the value it refreshes, kept for ``ttl`` seconds."""

    __slots__ = ("ttl",)

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl

    def __call__(self) -> Any:
        if previous() is None:
            raise Gone
        return Cached(NOT_MODIFIED, ttl=self.ttl)


class NotKept(Exception):
    """The leading request's response is not one to keep (its status, an error, or the
    request went away): the requests that waited for it run the handler themselves."""


class Lead:
    """A load a web request may lead (an ASGI host's response cache): the layer runs it in
    the load's task, where it waits for the response the request gives once its handler
    ran (``response``), or for its refusal. ``cached`` says how a response is kept."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.response: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.load: asyncio.Future[Any] | None = None

    def __call__(self) -> Awaitable[Cached[Any]]:
        self.started.set()
        return self._kept()

    async def _kept(self) -> Cached[Any]:
        return self.cached(await self.response)

    def cached(self, response: Any) -> Cached[Any]:
        raise NotImplementedError

    def refuse(self) -> None:
        if not self.response.done():
            self.response.set_exception(NotKept())

    async def lead_or_join(self, load: Callable[[], Awaitable[Any]]) -> bool:
        """Start ``load()`` (a call of the entry's loader) with this lead as what a load it
        leads runs. True once it leads (``self.load`` is the load: the request runs its
        handler, then gives the response or refuses); False once the load ended without
        it (a hit, or another request's load: its outcome is ``self.load``'s)."""
        with leading(self):
            self.load = asyncio.ensure_future(load())  # copies the context: leads with ``self``
        self.load.add_done_callback(_retrieved)
        started = asyncio.ensure_future(self.started.wait())
        try:
            await asyncio.wait({self.load, started}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the request went away: a load it leads must not wait for it
            started.cancel()
            self.refuse()
            raise
        if self.started.is_set():
            return True
        started.cancel()
        return False


def _retrieved(load: asyncio.Future[Any]) -> None:
    """A load's error is told to the requests that waited for it; retrieved here too, for
    a leader that went away (asyncio would log it as never retrieved)."""
    if not load.cancelled():
        load.exception()
