"""FastAPI endpoints cached through dependencies: ``cache()`` for a GET endpoint, whose
concurrent misses of one URL, in every worker process, run the endpoint once, and
``cache_evict()`` for a write endpoint, which invalidates the URLs it names once it
returned. ETags and 304s on every cached response.

    from stampede.fastapi import cache, cache_evict, caching

    app = FastAPI()
    caching(app, Stampede.from_url("redis://127.0.0.1:6379/0"))
    product_cache = cache(ttl=60)

    @app.get("/products/{product_id}", dependencies=[Depends(product_cache)])
    async def product(product_id: int): ...

    @app.put("/products/{product_id}", dependencies=[Depends(cache_evict("/products/{product_id}"))])
    async def update(product_id: int, change: Change): ...

How: ``cache()``'s dependency reads the URL's entry through the layer. On a hit (or once
another request's load of it ended, in this process or another) it answers at once
with the kept response, and the endpoint does not run. The request that leads the load
runs the endpoint; the middleware ``caching()`` installs keeps its response (a 200 with
no ``Set-Cookie``) and hands it to the requests that waited. A response that is not
kept is handed to nobody: each waiting request then runs the endpoint itself.

What is never shared: a request carrying ``Authorization`` or ``Cookie`` runs the endpoint
itself unless the cache varies on that header (``vary=("authorization",)``): one user's
page is never another's. Nor is one host's: the key holds the scheme, the ``Host`` and
the headers frameworks build URLs from (``key_headers``: ``Forwarded``, ``X-Forwarded-Host``
and their kin, as ``stampede.http`` keys them), so a page built with ``url_for`` for
``Host: evil.example`` reaches nobody asking another host.

One resource is one entry: the path in the key is the route's, formatted with its path
parameters as the endpoint receives them (``/products/007`` and ``/products/7`` are
product 7 of ``/products/{product_id: int}``), and ``cache_evict`` formats its paths
with the write route's parameters the same way. Entries are tagged by that path, so
``cache_evict`` drops every query string and varied copy of it. In tests, ``app.dependency_overrides[product_cache]
= lambda: None`` turns a route's caching off, since the dependency decides everything.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._core.pickle_serializer import PickleSerializer
from ._core.results import Cached
from ._errors import BackendUnavailable, ConfigError
from ._hosted import Lead, NotKept, aproduce
from ._layer import Stampede
from .http._policy import DEFAULT_KEY_HEADERS, none_match

KEPT_STATUSES = (200,)
NEVER_KEPT_HEADERS = {"set-cookie", "content-length", "etag", "cache-control", "connection", "transfer-encoding"}
PERSONAL = ("authorization", "cookie")
"""Request headers that make a response one user's: such a request is not shared unless
the cache varies on them."""

_LEAD = "stampede.fastapi.lead"
_EVICT = "stampede.fastapi.evict"


@dataclass
class _Kept:
    """A response as kept: status, its headers (less those never kept), body, ETag."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    etag: str


class _Served(Exception):
    """Raised by the dependency to answer with a kept response (caught by the handler
    ``caching()`` installs), so that the endpoint does not run."""

    def __init__(self, kept: _Kept, cache_control: str | None) -> None:
        self.kept = kept
        self.cache_control = cache_control


class _Lead(Lead):
    """A response's load a request leads: kept for ``ttl``, sent with ``cache_control``,
    if its status is one of ``statuses``."""

    def __init__(self, ttl: float, cache_control: str | None, statuses: frozenset[int]) -> None:
        super().__init__()
        self.ttl = ttl
        self.cache_control = cache_control
        self.statuses = statuses

    def cached(self, response: _Kept) -> Cached[_Kept]:
        return Cached(response, ttl=self.ttl)


@dataclass
class _Caching:
    """What ``caching()`` put on the app: the layer and its loader of responses."""

    layer: Stampede
    load: Any
    tag: str


def caching(app: Any, layer: Stampede, *, namespace: str = "fastapi") -> None:
    """Serve ``app``'s ``cache()`` and ``cache_evict()`` dependencies from ``layer`` (one
    with an asyncio client): installs the middleware that keeps leading responses and
    the handler that answers from the cache. Responses are pickled (bytes and headers):
    the server must be trusted as the database is."""
    if not layer.serves_async:
        raise ConfigError("stampede.fastapi needs a layer with an asyncio client (Stampede.from_url makes one)")

    tag = f"{namespace}-path:{{path}}"
    template = f"{namespace}:{{path}}|{{variant}}"
    loader = layer.cached_loader(template, tags=[tag], serializer=PickleSerializer())(_leader_runs)
    app.state.stampede_caching = _Caching(layer, loader, tag)
    app.add_middleware(_KeepLeadingResponses)
    app.add_exception_handler(_Served, _served)


async def _leader_runs(path: str, variant: str) -> Any:
    """The loader of every response: what the request that leads the load gave (its
    ``_Lead``), run in the load's task."""
    return await aproduce(path)


def cache(
    ttl: float,
    *,
    vary: Iterable[str] = (),
    cache_control: str | None = None,
    statuses: Iterable[int] = KEPT_STATUSES,
    key_headers: Sequence[str] = DEFAULT_KEY_HEADERS,
) -> Callable[[Request], Awaitable[None]]:
    """A dependency (``Depends(cache(ttl=60))``) that serves a GET endpoint's response
    from the cache for ``ttl`` seconds, keyed by its route's path with the path
    parameters converted, the query string, the scheme, the host, the request headers
    named in ``key_headers`` (the ones URLs are built from behind a proxy) and in
    ``vary`` (a HEAD request is answered from it too, with no body); ``cache_control``:
    the ``Cache-Control`` sent with it (none unless given); ``statuses``: the statuses
    kept (200)."""
    if ttl <= 0:
        raise ConfigError(f"cache(ttl=...) must be > 0 seconds, got {ttl!r}")
    if isinstance(key_headers, str):
        raise ConfigError(f"cache(key_headers=...) takes a sequence of header names, got the string {key_headers!r}")
    varied = tuple(sorted({name.lower() for name in key_headers} | {name.lower() for name in vary}))
    kept_statuses = frozenset(statuses)

    async def cached_response(request: Request) -> None:
        if request.method not in ("GET", "HEAD") or any(h in request.headers and h not in varied for h in PERSONAL):
            return  # not shared: the endpoint runs
        state = _state(request)
        path, variant = _resource(request), _variant(request, varied)
        if request.method == "HEAD":  # answered from a kept GET; a miss leads nothing (no body to keep)
            try:
                found = await state.load.peek(path, variant)
            except BackendUnavailable:
                return  # the cache is away: the endpoint answers, as a GET's would
            if found is not None:
                raise _Served(found.value, cache_control)
            return
        lead = _Lead(ttl, cache_control, kept_statuses)
        if await lead.lead_or_join(lambda: state.load(path, variant)):
            request.scope[_LEAD] = lead  # its endpoint runs, the middleware keeps its response
            return
        assert lead.load is not None
        try:
            kept = lead.load.result()
        except NotKept:
            return  # the leading request's response was not one to keep: run the endpoint here too
        raise _Served(kept, cache_control)

    return cached_response


def cache_evict(*paths: str) -> Callable[[Request], Awaitable[None]]:
    """A dependency for a write endpoint: once it ran, and before its response is sent,
    the cached responses of ``paths`` (the app's own, as its routes name them, formatted
    with the request's path parameters: ``"/products/{product_id}"``; an app served under
    a ``root_path`` has it put before them), every query string and varied copy of each,
    are invalidated. Whatever the endpoint answered, even an error: a write may have
    happened before it failed."""
    if not paths:
        raise ConfigError("cache_evict() needs the paths whose responses it invalidates")

    async def evict_after(request: Request) -> None:
        _state(request)  # refused at once without caching()
        root = request.scope.get("root_path", "")  # an app served under a prefix keys its pages by the whole path
        params = _converted_params(request)
        request.scope.setdefault(_EVICT, []).extend(root + path.format(**params) for path in paths)

    return evict_after


def _state(request: Request) -> _Caching:
    found = getattr(request.app.state, "stampede_caching", None)
    if found is None:
        raise ConfigError("stampede.fastapi's dependencies need stampede.fastapi.caching(app, layer) first")
    return found  # type: ignore[no-any-return]


_path_fields: dict[int, tuple[Any, list[Any]]] = {}
"""Each route's path parameters as FastAPI validates them, by the route's id (a route
is not hashable), the route held so that its id names no other; emptied when it holds
``_KEPT_ROUTES`` (apps made again and again, as tests make them)."""
_KEPT_ROUTES = 4096


def _converted_params(request: Request) -> dict[str, Any]:
    """The request's path parameters as its route's endpoint receives them, each as text
    (``"007"`` for an ``int`` is ``"7"``); a parameter the route does not type, or one
    that fails its validation (the endpoint answers 422, kept by nobody), as received."""
    params: dict[str, Any] = dict(request.path_params)
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if not params or dependant is None:
        return params
    from fastapi.dependencies.utils import request_params_to_args

    kept = _path_fields.get(id(route))
    if kept is None:
        if len(_path_fields) >= _KEPT_ROUTES:
            _path_fields.clear()
        kept = _path_fields[id(route)] = (route, _path_params_of(dependant))
    fields = kept[1]
    for alias, field in ((getattr(field, "alias", field.name), field) for field in fields):
        if alias not in params:
            continue
        values, errors = request_params_to_args([field], {alias: params[alias]})
        if not errors and field.name in values:
            value = values[field.name]
            params[alias] = str(value.value if isinstance(value, enum.Enum) else value)
    return params


def _path_params_of(dependant: Any) -> list[Any]:
    """The path parameters of an endpoint and of every dependency it has, the first of
    each name first (as FastAPI's own flattening finds them)."""
    fields: dict[str, Any] = {}
    pending = [dependant]
    while pending:
        found = pending.pop(0)
        for field in getattr(found, "path_params", ()):
            fields.setdefault(getattr(field, "alias", field.name), field)
        pending += getattr(found, "dependencies", ())
    return list(fields.values())


def _resource(request: Request) -> str:
    """The path of the entry: the route's path formatted with the converted parameters,
    so that every spelling of one resource is one entry, or the path as received where
    there is no route to read."""
    route_path = getattr(request.scope.get("route"), "path_format", None)
    if not isinstance(route_path, str) or not request.path_params:
        return request.url.path
    try:
        return str(request.scope.get("root_path", "")) + route_path.format(**_converted_params(request))
    except (KeyError, IndexError, ValueError):
        return request.url.path


def _variant(request: Request, varied: tuple[str, ...]) -> str:
    """The scheme, the host, the query string (its pairs sorted) and the keyed and
    varied headers, hashed: a key of bounded length whatever the request."""
    query = sorted(urllib.parse.parse_qsl(request.url.query, keep_blank_values=True))
    host = request.headers.get("host", "").lower()
    parts = [request.url.scheme, host, urllib.parse.urlencode(query)]
    parts += (f"{name}={','.join(request.headers.getlist(name))}" for name in varied)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _answer(
    kept: _Kept, cache_control: str | None, if_none_match: str | None
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    headers = [*kept.headers, (b"etag", kept.etag.encode())]
    if cache_control:
        headers.append((b"cache-control", cache_control.encode()))
    if if_none_match and none_match(kept.etag, if_none_match):
        return 304, [(name, value) for name, value in headers if name != b"content-type"], b""
    return kept.status, [*headers, (b"content-length", str(len(kept.body)).encode())], kept.body


async def _served(request: Request, served: Exception) -> Response:
    assert isinstance(served, _Served)
    status, headers, body = _answer(served.kept, served.cache_control, request.headers.get("if-none-match"))
    response = Response(content=b"" if request.method == "HEAD" else body, status_code=status)
    response.raw_headers = headers
    return response


class _KeepLeadingResponses:
    """The middleware: a request that leads a load has its response kept whole, then
    sent with its ETag (or as a 304), and handed to the load (or refused, so the requests
    that waited run the endpoint themselves); a request that evicts has its response
    held until the eviction is done."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []

        async def hold(message: Message) -> None:
            if scope.get(_LEAD) is None and not scope.get(_EVICT):
                await send(message)
            else:
                messages.append(message)

        try:
            await self.app(scope, receive, hold)
        except Exception:
            _refuse(scope)
            await _evict(scope)
            raise
        except BaseException:
            _refuse(scope)
            raise
        await _evict(scope)
        lead: _Lead | None = scope.get(_LEAD)
        kept = None if lead is None else _kept(messages, lead.statuses)
        if lead is None or kept is None:
            _refuse(scope)
            for message in messages:
                await send(message)
        else:
            lead.response.set_result(kept)
            status, headers, body = _answer(kept, lead.cache_control, Request(scope).headers.get("if-none-match"))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        if lead is not None and lead.load is not None:
            await asyncio.wait({lead.load})  # written before this request ends


async def _evict(scope: Scope) -> None:
    paths = scope.get(_EVICT)
    if paths:
        state = _state(Request(scope))
        for path in dict.fromkeys(paths):
            await state.layer.ainvalidate_tag(state.tag, path=path)


def _refuse(scope: Scope) -> None:
    lead: _Lead | None = scope.get(_LEAD)
    if lead is not None:
        lead.refuse()


def _kept(messages: list[Message], statuses: frozenset[int]) -> _Kept | None:
    """The response the messages make, if it is one to keep."""
    start = next((m for m in messages if m["type"] == "http.response.start"), None)
    if start is None or start["status"] not in statuses:
        return None
    headers = [(bytes(name).lower(), bytes(value)) for name, value in start.get("headers", [])]
    if any(name == b"set-cookie" for name, _ in headers):
        return None  # a cookie is one client's
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    kept_headers = [(name, value) for name, value in headers if name.decode() not in NEVER_KEPT_HEADERS]
    return _Kept(start["status"], kept_headers, body, f'"{hashlib.sha256(body).hexdigest()[:32]}"')
