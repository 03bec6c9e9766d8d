"""A reverse proxy to the cache-tests origin: ``stampede.http`` in front of a forwarding
app, the way the suite's published reverse proxies are measured (``run.py``).

``asgi_app``: an httpx forwarder under ``CacheMiddleware`` (for uvicorn); ``wsgi_app``:
the same under ``WSGICacheMiddleware`` (for gunicorn). Both read ``CACHE_TESTS_ORIGIN``
(the origin's base URL) and ``CACHE_TESTS_REDIS`` (the cache server's URL). The
forwarder sends the request on as it came (its raw target, its headers but the hop-by-hop
ones and ``Host``) and the response back as it came (its bytes, not decoded)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import httpx

from stampede.http import CacheMiddleware, ResponseCache, WSGICacheMiddleware

ORIGIN = os.environ.get("CACHE_TESTS_ORIGIN", "http://127.0.0.1:8000").rstrip("/")
REDIS = os.environ.get("CACHE_TESTS_REDIS", "redis://127.0.0.1:6379/0")
HOP_BY_HOP = {b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade", b"host"}
"""Not sent on. ``Connection`` is, for the cache to read (it drops what it names);
``Content-Length`` too, as the bytes are sent on as they came."""
TIMEOUT = httpx.Timeout(30.0)
LIMITS = httpx.Limits(max_keepalive_connections=0)
"""A new connection per request: some of the suite's responses are malformed on purpose
(a wrong ``Content-Length``), and their leftovers would garble the next response read on
a reused connection."""


REQUEST_ONLY = {b"connection", b"content-length"}  # httpx sets its own


def _sent_on(headers: Iterable[tuple[bytes, bytes]], request: bool = False) -> list[tuple[bytes, bytes]]:
    dropped = HOP_BY_HOP | REQUEST_ONLY if request else HOP_BY_HOP
    return [(name, value) for name, value in headers if name.lower() not in dropped]


def _named(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in _sent_on(headers)]


def _cache() -> ResponseCache:
    return ResponseCache.from_url(REDIS, namespace="cache-tests")  # the default settings


class _Forward:
    def __init__(self) -> None:
        self.client: httpx.AsyncClient | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        if self.client is None:
            self.client = httpx.AsyncClient(timeout=TIMEOUT, limits=LIMITS)
        target = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        request = self.client.build_request(scope["method"], ORIGIN + target, headers=_sent_on(scope["headers"], True),
                                            content=body)  # fmt: skip
        response = await self.client.send(request, stream=True)
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": _sent_on(response.headers.raw)})  # fmt: skip
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()


_CLIENT = httpx.Client(timeout=TIMEOUT, limits=LIMITS)


def _wsgi_forward(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
    target = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "")
    if "?" not in target and environ.get("QUERY_STRING"):
        target += "?" + environ["QUERY_STRING"]
    headers = [(name[5:].replace("_", "-").lower().encode(), str(value).encode("latin-1"))
               for name, value in environ.items() if name.startswith("HTTP_")]  # fmt: skip
    if environ.get("CONTENT_TYPE"):
        headers.append((b"content-type", environ["CONTENT_TYPE"].encode("latin-1")))
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    request = _CLIENT.build_request(environ["REQUEST_METHOD"], ORIGIN + target, headers=_sent_on(headers, True),
                                    content=body)  # fmt: skip
    response = _CLIENT.send(request, stream=True)
    reason = response.reason_phrase or "Unknown"
    start_response(f"{response.status_code} {reason}", _named(response.headers.raw))
    try:
        yield from response.iter_raw()
    finally:
        response.close()


asgi_app = CacheMiddleware(_Forward(), _cache())
wsgi_app = WSGICacheMiddleware(_wsgi_forward, _cache())
