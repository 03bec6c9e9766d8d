"""``WSGICacheMiddleware``: the response cache in front of a WSGI application (Flask,
Django's WSGI handler). See ``policy`` for what is cached, ``flow`` for how."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any

from .._core.results import Cached
from .cache import ResponseCache, Unshared
from .flow import Handover, Learn, Loaded, LoadResponse, Pass, ReadShape, Serve, respond
from .policy import Request, keep, stored

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], object]]
App = Callable[[Environ, StartResponse], Iterable[bytes]]

CONDITIONAL = ("HTTP_IF_NONE_MATCH", "HTTP_IF_MODIFIED_SINCE", "HTTP_IF_MATCH", "HTTP_IF_UNMODIFIED_SINCE",
               "HTTP_RANGE", "HTTP_IF_RANGE")  # fmt: skip
"""Request headers a load does not pass on: its response is the whole entity, for everyone."""


def request_of(environ: Environ) -> Request:
    headers = [(name[5:].replace("_", "-").lower(), str(value)) for name, value in environ.items()
               if name.startswith("HTTP_")]  # fmt: skip
    for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(name):
            headers.append((name.replace("_", "-").lower(), str(environ[name])))
    host = environ.get("HTTP_HOST") or f"{environ.get('SERVER_NAME', '')}:{environ.get('SERVER_PORT', '')}"
    path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
    return Request(environ["REQUEST_METHOD"], host, path, environ.get("QUERY_STRING", ""), headers)


def _status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


class _Stream:
    """A response not kept, partly read: sent on to the request whose load read it."""

    def __init__(self, status: str, headers: list[tuple[str, str]], read: list[bytes], rest: Iterator[bytes],
                 result: Iterable[bytes]) -> None:  # fmt: skip
        self.status, self.headers, self.read, self.rest, self.result = status, headers, read, rest, result

    def send_to(self, start_response: StartResponse, head: bool) -> Iterable[bytes]:
        start_response(self.status, [*self.headers, ("X-Cache", "PASS")])
        return self._body(head)

    def _body(self, head: bool) -> Iterator[bytes]:
        try:
            if not head:
                yield from self.read
                yield from self.rest
        finally:
            _close(self.result)


class _Load:
    """The producer a request hands the loader: what its load does, if it leads it."""

    def __init__(self, app: App, environ: Environ, request: Request, cache: ResponseCache) -> None:
        self.app, self.request, self.cache = app, request, cache
        self.environ = {name: value for name, value in environ.items() if name not in CONDITIONAL}
        self.environ.update({"REQUEST_METHOD": "GET", "CONTENT_LENGTH": "", "wsgi.input": io.BytesIO(b"")})
        self.owner = threading.get_ident()
        self.produced = False

    def load(self) -> Cached[Any]:
        self.produced = True
        started: list[Any] = []
        written: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            started[:] = [status, headers]
            return written.append

        result = self.app(dict(self.environ), start_response)
        rest = iter(result)
        read: list[bytes] = []
        try:
            first = next(rest, None)  # a generator may call start_response only now
            if first is not None:
                read.append(first)
            if not started:
                raise RuntimeError(f"the application sent no response to GET {self.request.path}")
            read[:0] = written
            status_line, raw_headers = started
            status = int(status_line.split(" ", 1)[0])
            headers = [(name.lower(), value) for name, value in raw_headers]
            kept = keep(status, headers, self.cache.rules)
            if kept is not None:
                size = sum(map(len, read))
                while size <= self.cache.max_body_bytes:
                    chunk = next(rest, None)
                    if chunk is None:
                        body = b"".join(read)
                        return Cached(stored(status, headers, body, self.request, kept), ttl=kept.ttl)
                    read.append(chunk)
                    size += len(chunk)
        except BaseException:
            _close(result)
            raise
        if threading.get_ident() != self.owner:  # a refresh in the background: nobody to hand it to
            _close(result)
            raise Unshared(None, None)
        raise Unshared(self, _Stream(status_line, raw_headers, read, rest, result))


def _close(result: Iterable[bytes]) -> None:
    """End an application's response iterable, as PEP 3333 asks of whoever read it."""
    close = getattr(result, "close", None)
    if close is not None:
        close()


class WSGICacheMiddleware:
    """``app = WSGICacheMiddleware(app, ResponseCache.from_url("redis://..."))``: the
    ASGI ``CacheMiddleware``'s promises, for a WSGI application."""

    def __init__(self, app: App, cache: ResponseCache) -> None:
        self.app = app
        self.cache = cache

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        request = request_of(environ)
        flow = respond(request, self.cache.rules)
        reply: Any = None
        try:
            while True:
                step = flow.send(reply)
                if isinstance(step, ReadShape):
                    reply = self.cache.shape(step.base)
                elif isinstance(step, LoadResponse):
                    producer = _Load(self.app, environ, request, self.cache)
                    try:
                        reply = Loaded(self.cache.loader(step.shape)(step.key, producer), producer.produced)
                    except Unshared as unshared:
                        reply = Loaded(None, unshared.producer is producer, unshared.handover)
                elif isinstance(step, Learn):
                    self.cache.learn(step.base, step.shape, step.rewrite)
                    reply = None
        except StopIteration as stop:
            outcome = stop.value
        if isinstance(outcome, Pass):
            return self.app(environ, start_response)
        if isinstance(outcome, Handover):
            return outcome.handover.send_to(start_response, request.method == "HEAD")  # type: ignore[no-any-return]
        assert isinstance(outcome, Serve)
        answer = outcome.answer
        headers = [(name.title(), value) for name, value in answer.headers]
        start_response(_status_line(answer.status), [*headers, ("X-Cache", outcome.status)])
        return [answer.body]
