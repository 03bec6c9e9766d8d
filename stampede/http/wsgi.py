"""``WSGICacheMiddleware``: the response cache in front of a WSGI application (Flask,
Django's WSGI handler). See ``policy`` for what is cached, ``flow`` for how."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

from .._core.results import Cached
from ._flow import Handover, Learn, Loaded, LoadResponse, Pass, ReadShape, Serve, respond
from ._policy import Request, Stored, answer, invalidated, keep, revalidated, stored, validators
from .cache import ResponseCache, Unshared, UpstreamError, masks_errors, page_tags, refreshed_page

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
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")  # gunicorn's; uWSGI's and mod_wsgi's
    if raw and raw.startswith("/"):  # as the client sent it: a %3F is not a ?
        target = raw.partition("?")[0]
    else:  # PEP 3333's PATH_INFO is decoded: encoded again, a %3F and a ? stay apart
        path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
        target = quote(path.encode("latin-1", "replace"), SAFE_IN_PATH)
    scheme = environ.get("wsgi.url_scheme", "http")
    return Request(environ["REQUEST_METHOD"], scheme, host, target, environ.get("QUERY_STRING", ""), headers)


SAFE_IN_PATH = "/:@!$&'()*+,;=-._~"
_CLASS_PHRASES = {1: "Informational", 2: "Success", 3: "Redirection", 4: "Client Error", 5: "Server Error"}


def _status_line(status: int) -> str:
    """A status line with a reason phrase, as PEP 3333 asks: the code's own, else its class's."""
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} {_CLASS_PHRASES.get(status // 100, 'Unknown')}"


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


class _Answered:
    """A handover of a stored response updated by a 304 that may not be kept."""

    def __init__(self, page: Stored, request: Request) -> None:
        self.page, self.request = page, request

    def send_to(self, start_response: StartResponse, head: bool) -> Iterable[bytes]:
        reply = answer(self.page, self.request)
        start_response(_status_line(reply.status), [*((name.title(), value) for name, value in reply.headers),
                                                    ("X-Cache", "PASS")])  # fmt: skip
        return [reply.body]


class _Raise:
    """A handover that raises the application's error in the request it belongs to (the
    server answers 500): a page whose response allowed no ``stale-if-error`` may not mask it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def send_to(self, start_response: StartResponse, head: bool) -> Iterable[bytes]:
        raise self.error


class _Load:
    """The producer a request hands the loader: what its load does, if it leads it."""

    def __init__(self, app: App, environ: Environ, request: Request, cache: ResponseCache, base: str) -> None:
        self.app, self.request, self.cache, self.base = app, request, cache, base
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

        prior = refreshed_page()
        conditions = validators(prior) if prior is not None else []
        environ = dict(self.environ)
        for name, value in conditions:  # revalidate what is stored, rather than fetch it whole
            environ["HTTP_" + name.upper().replace("-", "_")] = value
        asked = time.time()
        mine = threading.get_ident() == self.owner
        result: Iterable[bytes] = ()
        try:
            result = self.app(environ, start_response)
            rest = iter(result)
            read: list[bytes] = []
            first = next(rest, None)  # a generator may call start_response only now
        except Exception as error:
            _close(result)
            if prior is None or masks_errors(prior, time.time()) or not mine:
                raise  # the layer serves the stale page if it may, a refresh reports it
            raise Unshared(self, _Raise(error)) from error
        try:
            if first is not None:
                read.append(first)
            if not started:
                raise RuntimeError(f"the application sent no response to GET {self.request.target}")
            read[:0] = written
            status_line, raw_headers = started
            status = int(status_line.split(" ", 1)[0])
            headers = [(name.lower(), value) for name, value in raw_headers]
            answered = time.time()
            if status == 304 and prior is not None and conditions:
                _close(result)
                kept_prior, revalidation = revalidated(prior, headers, self.cache.rules, asked, answered)
                if revalidation is None:  # not to be kept now (a Set-Cookie, no-store): this request's alone
                    raise Unshared(self if mine else None, _Answered(kept_prior, self.request) if mine else None)
                return Cached(kept_prior, ttl=revalidation.ttl, tags=page_tags(self.base, kept_prior))
            if status >= 500 and masks_errors(prior, answered):
                # Read whole (the layer may serve the stale page and never send it on).
                read.extend(rest)
                _close(result)
                handover = _Stream(status_line, raw_headers, read, iter(()), ()) if mine else None
                raise UpstreamError(status, self if mine else None, handover)
            kept = keep(status, headers, self.cache.rules, asked, answered)
            if any(name == "content-type" and value.startswith("text/event-stream") for name, value in headers):
                kept = None  # a stream that may never end goes to its client as it comes
            if kept is not None:
                size = sum(map(len, read))
                while size <= self.cache.max_body_bytes:
                    chunk = next(rest, None)
                    if chunk is None:
                        body = b"".join(read)
                        page = stored(status, headers, body, self.request, kept, self.cache.rules, answered)
                        return Cached(page, ttl=kept.ttl, tags=page_tags(self.base, page))
                    read.append(chunk)
                    size += len(chunk)
        except UpstreamError:
            raise
        except BaseException:
            _close(result)
            raise
        if not mine:  # a refresh in the background: nobody to hand it to
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
        base = ""
        try:
            while True:
                step = flow.send(reply)
                if isinstance(step, ReadShape):
                    base = step.base
                    reply = self.cache.shape(step.base)
                elif isinstance(step, LoadResponse):
                    producer = _Load(self.app, environ, request, self.cache, base)
                    try:
                        fetched = self.cache.loader(step.shape).fetch(step.key, producer)
                        reply = Loaded(fetched.value, producer.produced, stale=fetched.stale)
                    except (Unshared, UpstreamError) as unshared:
                        reply = Loaded(None, unshared.producer is producer, unshared.handover)
                elif isinstance(step, Learn):
                    self.cache.learn(step.base, step.shape, step.rewrite)
                    reply = None
        except StopIteration as stop:
            outcome = stop.value
        if isinstance(outcome, Pass):
            return self.app(
                environ, self._invalidating(request, start_response) if outcome.invalidating else start_response
            )
        if isinstance(outcome, Handover):
            return outcome.handover.send_to(start_response, request.method == "HEAD")  # type: ignore[no-any-return]
        assert isinstance(outcome, Serve)
        answer = outcome.answer
        headers = [(name.title(), value) for name, value in answer.headers]
        start_response(_status_line(answer.status), [*headers, ("X-Cache", outcome.status)])
        return [answer.body]

    def _invalidating(self, request: Request, start_response: StartResponse) -> StartResponse:
        """``start_response``, which first invalidates what a successful unsafe request changed."""

        def invalidating_start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            named = [(name.lower(), value) for name, value in headers]
            bases = invalidated(request, int(status.split(" ", 1)[0]), named, self.cache.rules)
            if bases:
                self.cache.invalidate_urls(bases)
            return (
                start_response(status, headers, exc_info) if exc_info is not None else start_response(status, headers)
            )

        return invalidating_start_response
