"""The HTTP cache against what RFC 9111 and a shared cache's safety ask (issue 45), each
under both middlewares: a small site whose views the tests write, answered through
``CacheMiddleware`` (on an event loop of its own thread) or ``WSGICacheMiddleware``,
over the session's Redis server. Each test counts the view's calls.

``test_http.py`` runs the example apps under real multi-process servers; the HTTP Working
Group's suite runs in ``test_http_conformance.py``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import redis

from stampede import Stampede
from stampede.http import CacheMiddleware, ResponseCache, WSGICacheMiddleware

View = Callable[["Asked"], tuple[int, list[tuple[str, str]], bytes]]


@dataclass
class Asked:
    """What a view is asked: the method, the decoded path, the raw query, the headers."""

    method: str
    path: str
    query: str
    headers: dict[str, str]


@dataclass
class Site:
    """Views by decoded path; each call counted by path."""

    views: dict[str, View] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)

    def answer(self, asked: Asked) -> tuple[int, list[tuple[str, str]], bytes]:
        self.calls[asked.path] += 1
        view = self.views.get(asked.path)
        if view is None:
            return 404, [("content-type", "text/plain")], b"not found"
        return view(asked)

    async def asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        headers = {name.decode().lower(): value.decode() for name, value in scope["headers"]}
        asked = Asked(scope["method"], scope["path"], scope["query_string"].decode(), headers)
        status, response_headers, body = await asyncio.get_running_loop().run_in_executor(None, self.answer, asked)
        raw = [(name.encode(), value.encode()) for name, value in response_headers]
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def wsgi(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        headers = {name[5:].replace("_", "-").lower(): value for name, value in environ.items()
                   if name.startswith("HTTP_")}  # fmt: skip
        asked = Asked(environ["REQUEST_METHOD"], environ["PATH_INFO"], environ.get("QUERY_STRING", ""), headers)
        status, response_headers, body = self.answer(asked)
        start_response(f"{status} X", response_headers)
        return [body]


class Client:
    """Requests to the site through one middleware; ``kind`` is "asgi" or "wsgi"."""

    def __init__(self, kind: str, site: Site, cache: ResponseCache) -> None:
        self.kind, self.site, self.cache = kind, site, cache
        if kind == "asgi":
            self.loop = asyncio.new_event_loop()
            self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self.thread.start()
            transport = httpx.ASGITransport(CacheMiddleware(site.asgi, cache))  # type: ignore[arg-type]
            self.aclient = httpx.AsyncClient(transport=transport, base_url="http://site.test")
        else:
            transport = httpx.WSGITransport(WSGICacheMiddleware(site.wsgi, cache))  # type: ignore[arg-type]
            self.client = httpx.Client(transport=transport, base_url="http://site.test")

    def request(self, method: str, url: str, **headers: str) -> httpx.Response:
        sent = {name.replace("_", "-"): value for name, value in headers.items()}
        if self.kind == "asgi":
            made = self.aclient.request(method, url, headers=sent)
            return asyncio.run_coroutine_threadsafe(made, self.loop).result(30)
        return self.client.request(method, url, headers=sent)

    def get(self, url: str, **headers: str) -> httpx.Response:
        return self.request("GET", url, **headers)

    def close(self) -> None:
        if self.kind == "asgi":
            asyncio.run_coroutine_threadsafe(self.aclient.aclose(), self.loop).result(10)
            asyncio.run_coroutine_threadsafe(self.cache.aclose(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
        else:
            self.client.close()
        self.cache.close()


@pytest.fixture(params=["asgi", "wsgi"])
def site(request: pytest.FixtureRequest, redis_url: str, redis_client: redis.Redis) -> Iterator[tuple[Site, Client]]:
    served = Site()
    options = getattr(request, "param_options", {})
    layer = Stampede.from_url(redis_url, namespace="rfc", **options)
    client = Client(request.param, served, ResponseCache(layer))
    try:
        yield served, client
    finally:
        client.close()


def fixed(status: int, *headers: tuple[str, str], body: bytes = b"page") -> View:
    return lambda asked: (status, list(headers), body)


def counted(*headers: tuple[str, str], status: int = 200) -> View:
    """A view whose body says which call of it made it."""
    made = Counter[str]()

    def view(asked: Asked) -> tuple[int, list[tuple[str, str]], bytes]:
        made[asked.path] += 1
        return status, list(headers), f"call {made[asked.path]}".encode()

    return view


MAX_AGE_60 = ("cache-control", "max-age=60")


# --- 1, 2: the key ------------------------------------------------------------------------


def test_the_scheme_is_part_of_the_key(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/p"] = counted(MAX_AGE_60)
    assert client.get("http://site.test/p").text == "call 1"
    assert client.get("https://site.test/p").text == "call 2"  # not the http page
    assert client.get("https://site.test/p").headers["x-cache"] == "HIT"
    assert served.calls["/p"] == 2


def test_a_percent_encoded_question_mark_cannot_spell_another_urls_key(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/item"] = counted(MAX_AGE_60)
    missing = client.get("/item%3Fx=1")  # a 404, kept 10 s by negative caching
    assert missing.status_code == 404
    assert client.get("/item?x=1").status_code == 200  # its own entry, not the 404's


def test_a_path_cannot_spell_a_vary_variant(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/page"] = counted(MAX_AGE_60, ("vary", "accept-language"))
    assert client.get("/page", accept_language="en").text == "call 1"
    forged = client.get("/page%20vary:0123", accept_language="en")
    assert forged.status_code == 404
    assert client.get("/page", accept_language="en").text == "call 1"


@pytest.mark.parametrize(("first", "second"), [("q=%E9", "q=%E8"), ("a", "a="), ("a=1&a=2", "a=2&a=1")])
def test_queries_the_application_can_tell_apart_have_entries_apart(
    site: tuple[Site, Client], first: str, second: str
) -> None:
    served, client = site
    served.views["/q"] = lambda asked: (200, [MAX_AGE_60], asked.query.encode())
    assert client.get(f"/q?{first}").text == first
    assert client.get(f"/q?{second}").text == second


def test_the_forwarded_host_is_keyed(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/p"] = lambda asked: (200, [MAX_AGE_60], asked.headers.get("x-forwarded-host", "-").encode())
    assert client.get("/p", x_forwarded_host="evil.example").text == "evil.example"
    assert client.get("/p").text == "-"  # not the page built for evil.example
    assert client.get("/p").headers["x-cache"] == "HIT"


# --- 3: pathsend --------------------------------------------------------------------------


def test_a_load_is_not_offered_pathsend(redis_url: str, redis_client: redis.Redis, tmp_path: Any) -> None:
    """An application that sends a file by ``http.response.pathsend`` when the server offers
    it: the load's call is not offered it, so the file's bytes are what is kept."""
    page = tmp_path / "file.txt"
    page.write_bytes(b"the file's bytes")
    offered: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        can = "http.response.pathsend" in scope.get("extensions", {})
        offered.append(can)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"cache-control", b"max-age=60")]})
        if can:
            await send({"type": "http.response.pathsend", "path": str(page)})
        else:
            await send({"type": "http.response.body", "body": page.read_bytes()})

    cache = ResponseCache(Stampede.from_url(redis_url, namespace="pathsend"))

    async def twice() -> list[bytes]:
        bodies = []
        for _ in range(2):
            sent: list[dict[str, Any]] = []

            async def send(message: dict[str, Any], sent: list[dict[str, Any]] = sent) -> None:
                sent.append(message)

            async def receive() -> dict[str, Any]:
                return {"type": "http.request", "body": b"", "more_body": False}

            scope = {"type": "http", "method": "GET", "scheme": "http", "path": "/f", "raw_path": b"/f",
                     "query_string": b"", "headers": [(b"host", b"site.test")], "extensions": {
                         "http.response.pathsend": {}}}  # fmt: skip
            await CacheMiddleware(app, cache)(scope, receive, send)
            bodies.append(b"".join(message.get("body", b"") for message in sent))
        await cache.aclose()
        return bodies

    try:
        assert asyncio.run(twice()) == [b"the file's bytes"] * 2
        assert offered == [False]
    finally:
        cache.close()


# --- 4: a response that is not kept is no error -------------------------------------------


def test_stale_if_error_masks_errors_only(site: tuple[Site, Client]) -> None:
    served, client = site
    answers = iter([(200, "max-age=1, stale-if-error=60", b"old"), (200, "no-store", b"new"),
                    (503, "no-store", b"down")])  # fmt: skip

    def view(asked: Asked) -> tuple[int, list[tuple[str, str]], bytes]:
        status, cc, body = next(answers)
        return status, [("cache-control", cc)], body

    served.views["/p"] = view
    assert client.get("/p").text == "old"
    time.sleep(1.2)
    fresh = client.get("/p")  # a valid answer that is not shared: it is the answer
    assert fresh.text == "new" and fresh.headers["x-cache"] == "PASS"
    assert client.cache.layer.stats()["loader_errors"] == 0  # and no error
    time.sleep(0.1)
    masked = client.get("/p")  # an error: the stale page is served in its place
    assert masked.text == "old" and masked.headers["x-cache"] == "STALE"
    stats = client.cache.layer.stats()
    assert stats["uncached_results"] >= 1


# --- 5, 6, 7 --------------------------------------------------------------------------------


@pytest.mark.parametrize("directive", ["must-revalidate", "proxy-revalidate", "s-maxage=1"])
def test_must_revalidate_stops_the_stale_windows(site: tuple[Site, Client], directive: str) -> None:
    served, client = site
    served.views["/p"] = counted(("cache-control", f"max-age=1, {directive}, stale-while-revalidate=60"))
    assert client.get("/p").text == "call 1"
    time.sleep(1.2)
    assert client.get("/p").text == "call 2"  # not the stale page


def test_a_request_saying_no_store_stores_nothing(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/p"] = counted(MAX_AGE_60)
    assert client.get("/p", cache_control="no-store").text == "call 1"
    assert client.get("/p").text == "call 2"


def test_an_applications_own_304_to_an_unconditional_load_is_not_kept(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/p"] = fixed(304, MAX_AGE_60, ("etag", '"x"'), body=b"")
    assert client.get("/p").status_code == 304
    assert client.get("/p").headers.get("x-cache") != "HIT"
    assert served.calls["/p"] == 2


def test_headers_named_in_connection_are_not_kept(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/p"] = fixed(200, MAX_AGE_60, ("connection", "x-hop"), ("x-hop", "1"), ("x-end", "2"))
    client.get("/p")
    hit = client.get("/p")
    assert hit.headers["x-cache"] == "HIT" and "x-hop" not in hit.headers and hit.headers["x-end"] == "2"


def test_preconditions_apply_to_2xx_only(site: tuple[Site, Client]) -> None:
    _, client = site
    assert client.get("/missing").status_code == 404
    again = client.get("/missing", if_none_match="*")
    assert again.status_code == 404 and again.headers["x-cache"] == "HIT"


# --- 9, 10, 11: Age, Expires, Date ----------------------------------------------------------


def test_an_upstream_age_shortens_the_stay_and_is_sent_on(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/p"] = counted(("cache-control", "max-age=61"), ("age", "60"))
    first = client.get("/p")
    assert int(first.headers["age"]) >= 60
    time.sleep(1.2)  # 61 s of life, 60 already spent upstream
    assert client.get("/p").text == "call 2"


@pytest.mark.parametrize(
    ("expires", "kept"),
    [("Thu, 01 Jan 2099 00:00:00 GMT", True), ("Thursday, 01-Jan-99 00:00:00 GMT", False),
     ("Thu Jan  1 00:00:00 2099", True), ("0", False), ("Thu, 01 Jan 1970 00:00:00 GMT", False)],
)  # fmt: skip
def test_expires_is_read_as_an_http_date(site: tuple[Site, Client], expires: str, kept: bool) -> None:
    served, client = site
    served.views["/p"] = counted(("expires", expires))
    client.get("/p")
    assert (client.get("/p").headers.get("x-cache") == "HIT") is kept


def test_a_404_made_explicitly_stale_is_not_kept_by_the_status_ttl(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/gone"] = fixed(404, ("expires", "0"))
    client.get("/gone")
    client.get("/gone")
    assert served.calls["/gone"] == 2


def test_the_origins_date_is_kept(site: tuple[Site, Client]) -> None:
    from stampede.http._freshness import format_http_date

    served, client = site
    date = format_http_date(time.time() - 5)
    served.views["/p"] = fixed(200, ("cache-control", "max-age=600"), ("date", date))
    client.get("/p")
    hit = client.get("/p")
    assert hit.headers["x-cache"] == "HIT" and hit.headers["date"] == date  # not the serving time
    assert int(hit.headers["age"]) >= 4


# --- 12: Vary -------------------------------------------------------------------------------


def test_the_second_identical_request_of_a_varied_page_is_a_hit(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/p"] = lambda asked: (200, [MAX_AGE_60, ("vary", "accept-encoding")],
                                        asked.headers.get("accept-encoding", "").encode())  # fmt: skip
    assert client.get("/p", accept_encoding="gzip").text == "gzip"
    second = client.get("/p", accept_encoding="gzip")
    assert second.headers["x-cache"] == "HIT" and second.text == "gzip"
    assert client.get("/p", accept_encoding="GZIP ").headers["x-cache"] == "HIT"  # the same, spelt otherwise
    assert client.get("/p", accept_encoding="br").text == "br"
    assert served.calls["/p"] == 2


# --- 13: validation -------------------------------------------------------------------------


def test_a_stale_page_is_revalidated_with_its_validators(site: tuple[Site, Client]) -> None:
    served, client = site
    seen: list[dict[str, str]] = []

    def view(asked: Asked) -> tuple[int, list[tuple[str, str]], bytes]:
        seen.append(asked.headers)
        if asked.headers.get("if-none-match") == '"v,1"':
            return 304, [("cache-control", "max-age=1"), ("x-new", "yes")], b""
        return 200, [("cache-control", "max-age=1"), ("etag", '"v,1"')], b"the body"

    served.views["/p"] = view
    assert client.get("/p").text == "the body"
    time.sleep(1.2)
    again = client.get("/p")
    assert again.status_code == 200 and again.text == "the body" and again.headers["x-new"] == "yes"
    assert seen[-1].get("if-none-match") == '"v,1"'  # asked conditionally
    assert client.get("/p").headers["x-cache"] == "HIT"  # fresh again
    assert client.get("/p", if_none_match='"a", "v,1"').status_code == 304  # a tag with a comma


def test_if_modified_since_is_answered_from_a_fresh_page(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/p"] = fixed(200, MAX_AGE_60, ("last-modified", "Mon, 01 Jan 2024 00:00:00 GMT"))
    client.get("/p")
    assert client.get("/p", if_modified_since="Tue, 02 Jan 2024 00:00:00 GMT").status_code == 304
    assert client.get("/p", if_modified_since="Sun, 31 Dec 2023 00:00:00 GMT").status_code == 200


# --- 14, 15: invalidation -------------------------------------------------------------------


def test_a_successful_unsafe_request_invalidates_its_url_and_its_location(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/p"] = lambda asked: (
        (201, [("location", "/q")], b"") if asked.method == "POST" else (200, [MAX_AGE_60], b"page")
    )
    served.views["/q"] = counted(MAX_AGE_60)
    client.get("/p", accept_language="en")
    client.get("/q")
    assert client.get("/p").headers["x-cache"] == "HIT"
    assert client.request("POST", "/p").status_code == 201
    assert client.get("/p").headers["x-cache"] == "MISS"
    assert client.get("/q").text == "call 2"
    served.views["/p"] = lambda asked: (500, [], b"") if asked.method == "DELETE" else (200, [MAX_AGE_60], b"page")
    client.request("DELETE", "/p")  # an error invalidates nothing
    assert client.get("/p").headers["x-cache"] == "HIT"


def test_surrogate_keys_are_tags(site: tuple[Site, Client]) -> None:
    served, client = site
    served.views["/a"] = counted(MAX_AGE_60, ("surrogate-key", "product:7 list"))
    served.views["/b"] = counted(MAX_AGE_60, ("xkey", "product:8, list"))
    client.get("/a")
    client.get("/b")
    hit = client.get("/a")
    assert hit.headers["x-cache"] == "HIT" and "surrogate-key" not in hit.headers
    client.cache.layer.invalidate_tag("product:7")
    assert client.get("/a").text == "call 2" and client.get("/b").headers["x-cache"] == "HIT"
    client.cache.layer.invalidate_tag("list")
    assert client.get("/a").text == "call 3" and client.get("/b").text == "call 2"


# --- 16, 17, 18 -----------------------------------------------------------------------------


def test_a_wsgi_event_stream_reaches_its_client_before_it_ends(redis_url: str, redis_client: redis.Redis) -> None:
    released = threading.Event()

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("content-type", "text/event-stream"), MAX_AGE_60])
        yield b"data: 1\n\n"
        assert released.wait(10)
        yield b"data: 2\n\n"

    cache = ResponseCache(Stampede.from_url(redis_url, namespace="sse"))
    try:
        body = WSGICacheMiddleware(app, cache)({"REQUEST_METHOD": "GET", "PATH_INFO": "/e", "HTTP_HOST": "t",
                                                "wsgi.url_scheme": "http"}, lambda *args: None)  # fmt: skip
        chunks = iter(body)
        assert next(chunks) == b"data: 1\n\n"  # before the stream ends
        released.set()
        assert list(chunks) == [b"data: 2\n\n"]
    finally:
        released.set()
        cache.close()


def test_a_view_slower_than_wait_timeout_is_called_once_more_per_process_at_most(
    redis_url: str, redis_client: redis.Redis
) -> None:
    calls: list[float] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        calls.append(time.monotonic())
        time.sleep(1.0)
        start_response("200 OK", [MAX_AGE_60])
        return [b"slow"]

    cache = ResponseCache(Stampede.from_url(redis_url, namespace="slow", wait_timeout=0.3))
    middleware = WSGICacheMiddleware(app, cache)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/s", "HTTP_HOST": "t", "wsgi.url_scheme": "http"}
    try:
        with ThreadPoolExecutor(11) as pool:
            bodies = list(pool.map(lambda _: b"".join(middleware(dict(environ), lambda *a: None)), range(11)))
        assert bodies == [b"slow"] * 11
        assert len(calls) <= 2  # the leader's, and one for this process's waiters past wait_timeout
    finally:
        cache.close()


def test_wsgi_status_lines_have_a_reason_phrase(redis_url: str, redis_client: redis.Redis) -> None:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("299 Whatever", [MAX_AGE_60])
        return [b"x"]

    cache = ResponseCache(Stampede.from_url(redis_url, namespace="phrase"))
    lines: list[str] = []
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/s", "HTTP_HOST": "t", "wsgi.url_scheme": "http"}
    try:
        for _ in range(2):
            list(WSGICacheMiddleware(app, cache)(dict(environ), lambda status, headers: lines.append(status)))
        assert lines[-1] == "299 Success"
    finally:
        cache.close()


def test_a_vary_learnt_in_one_worker_costs_another_no_extra_call(redis_url: str, redis_client: redis.Redis) -> None:
    """Two workers (each its own ``ResponseCache``, with its own memory of page shapes):
    en in one, fr in the other, then en and fr again, make one call per language."""
    served = Site()
    served.views["/l"] = lambda asked: (200, [MAX_AGE_60, ("vary", "accept-language")],
                                        asked.headers.get("accept-language", "").encode())  # fmt: skip
    workers = [ResponseCache(Stampede.from_url(redis_url, namespace="workers")) for _ in range(2)]
    try:
        for cache in workers:  # both know the page has no Vary yet
            assert cache.shape(json_base("/l")).vary == ()
        middlewares = [WSGICacheMiddleware(served.wsgi, cache) for cache in workers]
        clients = [httpx.Client(transport=httpx.WSGITransport(middleware), base_url="http://site.test")
                   for middleware in middlewares]  # fmt: skip
        got = [clients[i % 2].get("/l", headers={"accept-language": lang}).text
               for i, lang in enumerate(["en", "fr", "en", "fr"])]  # fmt: skip
        assert got == ["en", "fr", "en", "fr"]
        assert served.calls["/l"] == 2
    finally:
        for cache in workers:
            cache.close()


def json_base(target: str) -> str:
    from stampede.http._policy import Request, Rules, base_key

    return base_key(Request("GET", "http", "site.test", target, "", [("host", "site.test")]), Rules())


def test_an_error_is_sent_when_the_page_allows_no_stale(site: tuple[Site, Client]) -> None:
    """A page kept past its freshness only to be revalidated (it has an ETag, and no
    ``stale-if-error``): the view's 503 is sent, not the stale page."""
    served, client = site
    kept = [("cache-control", "max-age=1"), ("etag", '"e"')]
    answers = iter([(200, kept, b"old"), (503, [], b"down"), (200, kept, b"new")])

    def view(asked: Asked) -> tuple[int, list[tuple[str, str]], bytes]:
        return next(answers)

    served.views["/p"] = view
    assert client.get("/p").text == "old"
    time.sleep(1.2)
    down = client.get("/p")
    assert down.status_code == 503 and down.text == "down"
    assert client.get("/p").text == "new"


def test_a_background_refresh_that_fails_is_reported(site: tuple[Site, Client]) -> None:
    """A page served stale while it is refreshed (``stale-while-revalidate``, no
    ``stale-if-error``) whose view then raises: the refresh counts as failed, and the
    stale page is still served within its window."""
    from ..scenarios import wait_until

    served, client = site
    calls = Counter[str]()

    def view(asked: Asked) -> tuple[int, list[tuple[str, str]], bytes]:
        calls["p"] += 1
        if calls["p"] > 1:
            raise ConnectionError("the database is down")
        return 200, [("cache-control", "max-age=1, stale-while-revalidate=60")], b"old"

    served.views["/p"] = view
    assert client.get("/p").text == "old"
    time.sleep(1.2)
    assert client.get("/p").text == "old"  # stale, while its refresh runs
    layer = client.cache.layer
    wait_until(lambda: layer.stats()["refresh_errors"] >= 1, "the failed refresh to be counted")
    assert client.get("/p").text == "old"
