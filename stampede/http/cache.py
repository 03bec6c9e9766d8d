"""``ResponseCache``: the entries of an HTTP response cache in a stampede layer.

Each response is the entry ``http:<variant key>`` of a loader whose load calls the
application (``_drivers``: ``asgi`` and ``wsgi``), so concurrent requests for one page,
in every worker process, make one call of the view, and the rest get its response. The
loader's arguments are the key and the request to replay, so a background refresh
(``stale-while-revalidate``) calls the view again with the request that found the page
stale.

A response's stale windows come from its own ``Cache-Control``, while a loader's are
settings: so there is one loader per pair of windows (whole seconds, at most
``MAX_WINDOW_PAIRS``; beyond, none), all over the same entries, and a request picks
the one its URL's ``Shape`` names. The shape (and the headers the URL varies on) is an
entry of its own, ``http-shape:<url>``, written by a load whose response changed it and
kept in this process for ``SHAPE_MEMORY`` seconds: a stale shape costs a request a
second lookup, never a wrong response (``policy.matches``).

Every response entry is tagged: with its URL's tag (``policy.url_tag``), so that an
unsafe method's response drops every variant of its URL, and with the names of its
``Surrogate-Key`` (or ``xkey``) header, so that ``layer.invalidate_tag("product:7")``
drops every page that showed product 7, with the tag promise: no load begun before it
writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from cachetools import TTLCache

from .._acached import AsyncCachedLoader
from .._cached import CachedLoader
from .._core.results import Cached, Unkept, previous
from .._layer import Stampede
from ._policy import (
    DEFAULT_KEY_HEADERS,
    DEFAULT_STATUS_TTLS,
    DEFAULT_TAG_HEADERS,
    Rules,
    Shape,
    Stored,
    StoredSerializer,
    url_tag,
)

MAX_WINDOW_PAIRS = 32
SHAPE_MEMORY = 1.0
SHAPES_KEPT = 10_000


class Unshared(Unkept):
    """A load's response that is not kept, and so goes to the request that made it
    only (``handover``: what its driver needs to send it). A concurrent request that
    joined the load calls the application itself. No error: no stale page is served in
    its place, and no loader error is counted (``Unkept``)."""

    def __init__(self, producer: object, handover: Any) -> None:
        super().__init__("a response that is not shared")
        self.producer = producer
        self.handover = handover


class UpstreamError(Exception):
    """The application's answer to a load is an error (a 5xx) that a stale page may mask:
    the layer serves the stale page in its place (``stale_if_error``). If it has none, the
    request whose load it was is sent the error itself (``handover``), as a joiner calls
    the application itself."""

    def __init__(self, status: int, producer: object, handover: Any) -> None:
        super().__init__(f"the application answered {status}")
        self.producer = producer
        self.handover = handover


def refreshed_page() -> Stored | None:
    """Inside a load: the stored response it refreshes, if any (``previous()``)."""
    found = previous()
    value = found.value if found is not None else None
    return value if isinstance(value, Stored) else None


def masks_errors(prior: Stored | None, now: float) -> bool:
    """Whether the response a load refreshes may be served in place of its error."""
    return prior is not None and now <= prior.errors_masked_until()


def _load(key: str, producer: Any) -> Any:
    return producer.load()


async def _aload(key: str, producer: Any) -> Any:
    return await producer.load()


def _no_shape(base: str) -> Any:
    return None  # never loaded: shapes are only peeked and set


async def _ano_shape(base: str) -> Any:
    return None


def page_tags(base: str, stored: Stored) -> list[str]:
    """The tags of a page: its URL's, and those its response named."""
    return [url_tag(base), *stored.tags]


class ResponseCache:
    """The response entries of one layer, shared by the ASGI and WSGI middlewares.

    ``status_ttls``: seconds to keep a response of that status that says nothing of its
    freshness (404 and 410: 10 s; give ``{}`` for none). ``share_authorized``: also
    answer requests carrying ``Authorization`` or a ``Cookie`` from the cache (only if
    every response to them is the same for everyone). ``max_ttl``, ``max_stale``: bounds
    on what responses ask for. ``max_body_bytes``: a larger body is streamed through
    and not kept (the layer's ``max_value_bytes`` by default). ``key_headers``: request
    headers in every key (those an application may build a page from with no ``Vary``:
    ``X-Forwarded-Host`` and its kin by default; add any other your application trusts).
    ``tag_headers``: response headers whose names tag the page (and are not sent on).
    ``heuristic_fraction``: keep a response that says nothing of its freshness but has a
    ``Last-Modified`` for this fraction of its age (RFC 9111 section 4.2.2; 0, the
    default: not at all)."""

    def __init__(
        self,
        layer: Stampede,
        *,
        status_ttls: Mapping[int, float] = DEFAULT_STATUS_TTLS,
        share_authorized: bool = False,
        max_ttl: float = 86400.0,
        max_stale: float = 86400.0,
        max_body_bytes: int | None = None,
        key_headers: tuple[str, ...] = DEFAULT_KEY_HEADERS,
        tag_headers: tuple[str, ...] = DEFAULT_TAG_HEADERS,
        heuristic_fraction: float = 0.0,
    ) -> None:
        self.layer = layer
        self.rules = Rules(dict(status_ttls), share_authorized, max_ttl, max_stale,
                           tuple(name.lower() for name in key_headers), tuple(name.lower() for name in tag_headers),
                           heuristic_fraction)  # fmt: skip
        default_bytes = max(0, layer.settings.max_value_bytes - 4096)  # room for the status and headers
        self.max_body_bytes = default_bytes if max_body_bytes is None else max_body_bytes
        self._lock = threading.Lock()
        self._blocking: dict[tuple[float, float], CachedLoader[..., Any]] = {}
        self._async: dict[tuple[float, float], AsyncCachedLoader[..., Any]] = {}
        self._serializer = StoredSerializer()
        self._shapes_seen: TTLCache[str, Shape] = TTLCache(SHAPES_KEPT, SHAPE_MEMORY)
        self._shape = (
            layer.cached_loader("http-shape:{base}", ttl=max_ttl)(_no_shape) if layer.serves_blocking else None
        )
        self._ashape = layer.cached_loader("http-shape:{base}", ttl=max_ttl)(_ano_shape) if layer.serves_async else None

    @classmethod
    def from_url(cls, url: str, *, namespace: str = "http", **options: Any) -> ResponseCache:
        """A cache over a new layer for ``url`` (``Stampede.from_url``): ``options`` are
        this class's arguments and the layer's settings."""
        own = {name: options.pop(name) for name in ("status_ttls", "share_authorized", "max_ttl", "max_stale",
                                                     "max_body_bytes", "key_headers", "tag_headers",
                                                     "heuristic_fraction") if name in options}  # fmt: skip
        return cls(Stampede.from_url(url, namespace=namespace, **options), **own)

    def _windows(self, shape: Shape) -> tuple[float, float]:
        pair = (float(int(shape.stale_while_revalidate)), float(int(shape.stale_if_error)))
        known = len(self._blocking) + len(self._async)
        return pair if pair in self._blocking or pair in self._async or known < MAX_WINDOW_PAIRS else (0.0, 0.0)

    def _decorate(self, pair: tuple[float, float], func: Callable[..., Any]) -> Any:
        swr, sie = pair
        decorate = self.layer.cached_loader(
            "http:{key}", serializer=self._serializer, stale_while_revalidate=swr, stale_if_error=sie, tags=[]
        )
        return decorate(func)

    def loader(self, shape: Shape) -> CachedLoader[..., Any]:
        """The blocking loader whose stale windows are ``shape``'s."""
        pair = self._windows(shape)
        with self._lock:
            if pair not in self._blocking:
                self._blocking[pair] = self._decorate(pair, _load)
            return self._blocking[pair]

    def aloader(self, shape: Shape) -> AsyncCachedLoader[..., Any]:
        """The async loader whose stale windows are ``shape``'s."""
        pair = self._windows(shape)
        with self._lock:
            if pair not in self._async:
                self._async[pair] = self._decorate(pair, _aload)
            return self._async[pair]

    def _seen(self, base: str) -> Shape | None:
        with self._lock:  # cachetools caches are not thread-safe
            return self._shapes_seen.get(base)

    def _saw(self, base: str, shape: Shape) -> Shape:
        with self._lock:
            self._shapes_seen[base] = shape
        return shape

    def shape(self, base: str) -> Shape:
        """The shape of ``base``'s responses, as last seen (``Shape()`` if none)."""
        found = self._seen(base)
        if found is None:
            assert self._shape is not None
            fetched = self._shape.peek(base)
            found = self._saw(base, Shape.from_json(fetched.value) if fetched else Shape())
        return found

    async def ashape(self, base: str) -> Shape:
        """``shape``, with this event loop's client."""
        found = self._seen(base)
        if found is None:
            assert self._ashape is not None
            fetched = await self._ashape.peek(base)
            found = self._saw(base, Shape.from_json(fetched.value) if fetched else Shape())
        return found

    def learn(self, base: str, shape: Shape, rewrite: tuple[str, Stored] | None = None) -> None:
        """Record ``shape`` as ``base``'s, after a load whose response had it, and write
        that response again with the shape's stale windows (``flow.Learn``)."""
        assert self._shape is not None
        self._shape.set(shape.to_json(), base)
        self._saw(base, shape)
        if rewrite is not None:
            key, stored = rewrite
            self.loader(shape).set(Cached(stored, ttl=stored.ttl, tags=page_tags(base, stored)), key, None)

    async def alearn(self, base: str, shape: Shape, rewrite: tuple[str, Stored] | None = None) -> None:
        """``learn``, with this event loop's client."""
        assert self._ashape is not None
        await self._ashape.set(shape.to_json(), base)
        self._saw(base, shape)
        if rewrite is not None:
            key, stored = rewrite
            await self.aloader(shape).set(Cached(stored, ttl=stored.ttl, tags=page_tags(base, stored)), key, None)

    def invalidate_urls(self, bases: list[str]) -> None:
        """Drop every variant of each URL whose entry is in ``bases`` (an unsafe method's
        response), as ``invalidate_tag`` does: no load begun before writes."""
        for base in bases:
            self.layer.invalidate_tag(url_tag(base))

    async def ainvalidate_urls(self, bases: list[str]) -> None:
        """``invalidate_urls``, with this event loop's client."""
        for base in bases:
            await self.layer.ainvalidate_tag(url_tag(base))

    def close(self) -> None:
        self.layer.close()

    async def aclose(self) -> None:
        await self.layer.aclose()
