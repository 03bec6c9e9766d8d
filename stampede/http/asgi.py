"""``CacheMiddleware``: the response cache in front of an ASGI application (Starlette,
FastAPI, Django's ASGI handler). See ``policy`` for what is cached, ``flow`` for how."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import quote

from .._core.results import Cached
from ._flow import Handover, Learn, Loaded, LoadResponse, Pass, ReadShape, Serve, respond
from ._policy import Request, Stored, answer, invalidated, keep, revalidated, stored, validators
from .cache import ResponseCache, Unshared, UpstreamError, masks_errors, page_tags, refreshed_page

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

CONDITIONAL = frozenset({b"if-none-match", b"if-modified-since", b"if-match", b"if-unmodified-since", b"range",
                         b"if-range"})  # fmt: skip
"""Request headers a load does not pass on: its response is the whole entity, for everyone."""
INFORMATIONAL_EXTENSIONS = frozenset({"tls"})
"""Scope extensions a load passes on: those that tell, not those that change how a
response is sent (``http.response.pathsend``, ``zerocopysend``, trailers, early hints),
which a load reading the response as messages would not understand."""
SAFE_IN_PATH = "/:@!$&'()*+,;=-._~"

_running: set[asyncio.Task[None]] = set()  # application calls still running after their response was read


def request_of(scope: Scope) -> Request:
    headers = [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in scope.get("headers", ())]
    host = next((value for name, value in headers if name == "host"), None)
    if host is None:
        server = scope.get("server") or ("", None)
        host = f"{server[0]}:{server[1]}" if server[1] else str(server[0])
    raw = scope.get("raw_path")
    if raw:  # as the client sent it: a %3F is not a ?
        target = raw.decode("latin-1").partition("?")[0]
    else:
        target = quote((scope.get("root_path", "") + scope["path"]).encode("utf-8", "surrogateescape"), SAFE_IN_PATH)
    query = scope.get("query_string", b"").decode("latin-1")
    return Request(scope["method"], scope.get("scheme", "http"), host, target, query, headers)


class _AppCall:
    """One call of the application for a load: a GET with no body, its messages read one
    by one (so a response found not to be kept can be handed over mid-stream)."""

    def __init__(self, app: App, scope: Scope) -> None:
        self._queue: asyncio.Queue[Message] = asyncio.Queue(maxsize=16)
        self._asked = False
        self.task = asyncio.get_running_loop().create_task(self._run(app, scope))
        _running.add(self.task)
        self.task.add_done_callback(_running.discard)

    async def _run(self, app: App, scope: Scope) -> None:
        await app(scope, self._receive, self._queue.put)

    async def _receive(self) -> Message:
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # a client that stays: the load's response is not its own
        raise AssertionError("unreachable")

    async def next(self) -> Message | None:
        """The application's next message, or None once it has returned (its error, if
        it raised)."""
        if not self._queue.empty():
            return self._queue.get_nowait()
        getter = asyncio.ensure_future(self._queue.get())
        await asyncio.wait({getter, self.task}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        if not self._queue.empty():
            return self._queue.get_nowait()
        self.task.result()
        return None


class _Stream:
    """A response not kept, partly read: sent on to the request whose load read it."""

    def __init__(self, start: Message, read: list[Message], call: _AppCall) -> None:
        self.start, self.read, self.call = start, read, call

    async def send_to(self, send: Send, head: bool) -> None:
        await send({**self.start, "headers": [*self.start.get("headers", ()), (b"x-cache", b"PASS")]})
        if head:
            self.call.task.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        for message in self.read:
            await send(message)
        if self.read and not self.read[-1].get("more_body", False):
            return  # read whole already (an error read for the layer to weigh)
        while (more := await self.call.next()) is not None:
            await send(more)


class _Answered:
    """A handover of a stored response updated by a 304 that may not be kept."""

    def __init__(self, page: Stored, request: Request) -> None:
        self.page, self.request = page, request

    async def send_to(self, send: Send, head: bool) -> None:
        reply = answer(self.page, self.request)
        headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in reply.headers]
        await send(
            {"type": "http.response.start", "status": reply.status, "headers": [*headers, (b"x-cache", b"PASS")]}
        )
        await send({"type": "http.response.body", "body": reply.body, "more_body": False})


class _Raise:
    """A handover that raises the application's error in the request it belongs to (the
    server answers 500): a page whose response allowed no ``stale-if-error`` may not mask it."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    async def send_to(self, send: Send, head: bool) -> None:
        raise self.error


class _Load:
    """The producer a request hands the loader: what its load does, if it leads it."""

    def __init__(self, app: App, scope: Scope, request: Request, cache: ResponseCache, base: str) -> None:
        self.app, self.request, self.cache, self.base = app, request, cache, base
        self.headers = [(name, value) for name, value in scope.get("headers", ()) if name.lower() not in CONDITIONAL]
        extensions = {name: value for name, value in (scope.get("extensions") or {}).items()
                      if name in INFORMATIONAL_EXTENSIONS}  # fmt: skip
        self.scope = {**scope, "method": "GET", "headers": self.headers, "extensions": extensions}
        self.owner = asyncio.current_task()
        self.produced = False

    async def load(self) -> Cached[Any]:
        self.produced = True
        prior = refreshed_page()
        conditions = validators(prior) if prior is not None else []
        scope = self.scope
        if conditions:  # revalidate what is stored, rather than fetch it whole
            scope = {**scope, "headers": [*self.headers, *((n.encode("latin-1"), v.encode("latin-1"))
                                                          for n, v in conditions)]}  # fmt: skip
        asked = time.time()
        call = _AppCall(self.app, scope)
        try:
            try:
                start = await call.next()
            except Exception as error:
                if prior is None or masks_errors(prior, time.time()) or asyncio.current_task() is not self.owner:
                    raise  # the layer serves the stale page if it may, a refresh reports it
                raise Unshared(self, _Raise(error)) from error
            if start is None or start.get("type") != "http.response.start":
                raise RuntimeError(f"the application sent no response to GET {self.request.target}")
            status = int(start["status"])
            headers = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in start.get("headers", ())]
            answered = time.time()
            if status == 304 and prior is not None and conditions:
                call.task.cancel()
                kept_prior, kept = revalidated(prior, headers, self.cache.rules, asked, answered)
                if kept is None:  # not to be kept now (a Set-Cookie, no-store): this request's alone
                    mine = asyncio.current_task() is self.owner
                    raise Unshared(self if mine else None, _Answered(kept_prior, self.request) if mine else None)
                return Cached(kept_prior, ttl=kept.ttl, tags=page_tags(self.base, kept_prior))
            if status >= 500 and masks_errors(prior, answered):
                # Read whole (the layer may serve the stale page and never send it on).
                errors: list[Message] = []
                while (message := await call.next()) is not None:
                    errors.append(message)
                    if not message.get("more_body", False):
                        break
                await asyncio.wait({call.task}, timeout=1.0)
                call.task.cancel()
                mine = asyncio.current_task() is self.owner
                raise UpstreamError(status, self if mine else None, _Stream(start, errors, call) if mine else None)
            kept = keep(status, headers, self.cache.rules, asked, answered)
            if any(name == "content-type" and value.startswith("text/event-stream") for name, value in headers):
                kept = None
            read: list[Message] = []
            if kept is not None:
                size = 0
                while (message := await call.next()) is not None:
                    read.append(message)
                    size += len(message.get("body", b""))
                    if size > self.cache.max_body_bytes:
                        break
                    if not message.get("more_body", False):
                        body = b"".join(part.get("body", b"") for part in read)
                        page = stored(status, headers, body, self.request, kept, self.cache.rules, answered)
                        return Cached(page, ttl=kept.ttl, tags=page_tags(self.base, page))
        except Unshared as handed:
            if handed.producer is None:
                call.task.cancel()
            raise
        except UpstreamError:
            raise
        except BaseException:
            call.task.cancel()
            raise
        if asyncio.current_task() is not self.owner:  # a refresh in the background: nobody to hand it to
            call.task.cancel()
            raise Unshared(None, None)
        raise Unshared(self, _Stream(start, read, call))


class CacheMiddleware:
    """``app = CacheMiddleware(app, ResponseCache.from_url("redis://..."))``: GET and HEAD
    responses that may be shared are kept in the layer, and concurrent requests for one
    page, in every worker process, make one call of the application."""

    def __init__(self, app: App, cache: ResponseCache) -> None:
        self.app = app
        self.cache = cache

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = request_of(scope)
        flow = respond(request, self.cache.rules)
        reply: Any = None
        base = ""
        try:
            while True:
                step = flow.send(reply)
                if isinstance(step, ReadShape):
                    base = step.base
                    reply = await self.cache.ashape(step.base)
                elif isinstance(step, LoadResponse):
                    producer = _Load(self.app, scope, request, self.cache, base)
                    try:
                        fetched = await self.cache.aloader(step.shape).fetch(step.key, producer)
                        reply = Loaded(fetched.value, producer.produced, stale=fetched.stale)
                    except (Unshared, UpstreamError) as unshared:
                        reply = Loaded(None, unshared.producer is producer, unshared.handover)
                elif isinstance(step, Learn):
                    await self.cache.alearn(step.base, step.shape, step.rewrite)
                    reply = None
        except StopIteration as stop:
            outcome = stop.value
        if isinstance(outcome, Pass):
            await self.app(scope, receive, self._invalidating(request, send) if outcome.invalidating else send)
        elif isinstance(outcome, Handover):
            await outcome.handover.send_to(send, request.method == "HEAD")
        elif isinstance(outcome, Serve):
            answer = outcome.answer
            headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in answer.headers]
            headers.append((b"x-cache", outcome.status.encode()))
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            await send({"type": "http.response.body", "body": answer.body, "more_body": False})

    def _invalidating(self, request: Request, send: Send) -> Send:
        """``send``, which first invalidates what a successful unsafe request changed."""

        async def invalidating_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in message.get("headers", ())]
                bases = invalidated(request, int(message["status"]), headers, self.cache.rules)
                if bases:
                    await self.cache.ainvalidate_urls(bases)
            await send(message)

        return invalidating_send
