"""``CacheMiddleware``: the response cache in front of an ASGI application (Starlette,
FastAPI, Django's ASGI handler). See ``policy`` for what is cached, ``flow`` for how."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .._core.results import Cached
from .cache import ResponseCache, Unshared
from .flow import Handover, Learn, Loaded, LoadResponse, Pass, ReadShape, Serve, respond
from .policy import Request, keep, stored

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

CONDITIONAL = frozenset({b"if-none-match", b"if-modified-since", b"if-match", b"if-unmodified-since", b"range",
                         b"if-range"})  # fmt: skip
"""Request headers a load does not pass on: its response is the whole entity, for everyone."""

_running: set[asyncio.Task[None]] = set()  # application calls still running after their response was read


def request_of(scope: Scope) -> Request:
    headers = [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in scope.get("headers", ())]
    host = next((value for name, value in headers if name == "host"), None)
    if host is None:
        server = scope.get("server") or ("", None)
        host = f"{server[0]}:{server[1]}" if server[1] else str(server[0])
    query = scope.get("query_string", b"").decode("latin-1")
    return Request(scope["method"], host, scope.get("root_path", "") + scope["path"], query, headers)


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
        while (more := await self.call.next()) is not None:
            await send(more)


class _Load:
    """The producer a request hands the loader: what its load does, if it leads it."""

    def __init__(self, app: App, scope: Scope, request: Request, cache: ResponseCache) -> None:
        self.app, self.request, self.cache = app, request, cache
        headers = [(name, value) for name, value in scope.get("headers", ()) if name.lower() not in CONDITIONAL]
        self.scope = {**scope, "method": "GET", "headers": headers}
        self.owner = asyncio.current_task()
        self.produced = False

    async def load(self) -> Cached[Any]:
        self.produced = True
        call = _AppCall(self.app, self.scope)
        try:
            start = await call.next()
            if start is None or start.get("type") != "http.response.start":
                raise RuntimeError(f"the application sent no response to GET {self.request.path}")
            status = int(start["status"])
            headers = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in start.get("headers", ())]
            kept = keep(status, headers, self.cache.rules)
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
                        return Cached(stored(status, headers, body, self.request, kept), ttl=kept.ttl)
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
        try:
            while True:
                step = flow.send(reply)
                if isinstance(step, ReadShape):
                    reply = await self.cache.ashape(step.base)
                elif isinstance(step, LoadResponse):
                    producer = _Load(self.app, scope, request, self.cache)
                    try:
                        found = await self.cache.aloader(step.shape)(step.key, producer)
                        reply = Loaded(found, producer.produced)
                    except Unshared as unshared:
                        reply = Loaded(None, unshared.producer is producer, unshared.handover)
                elif isinstance(step, Learn):
                    await self.cache.alearn(step.base, step.shape, step.rewrite)
                    reply = None
        except StopIteration as stop:
            outcome = stop.value
        if isinstance(outcome, Pass):
            await self.app(scope, receive, send)
        elif isinstance(outcome, Handover):
            await outcome.handover.send_to(send, request.method == "HEAD")
        elif isinstance(outcome, Serve):
            answer = outcome.answer
            headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in answer.headers]
            headers.append((b"x-cache", outcome.status.encode()))
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            await send({"type": "http.response.body", "body": answer.body, "more_body": False})
