"""The HTTP response cache (``stampede.http``) in front of real applications under real
multi-process servers: examples/http_pages.py's Starlette app under 4 uvicorn workers and
its Flask app under 4 gunicorn workers, driven over HTTP by httpx with concurrency.

Each view counts its calls on the Redis server, whichever worker ran it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

EXAMPLES = Path(__file__).parent.parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

from http_pages import burst, serve, wait_until_up  # noqa: E402

from stampede.testing import free_port  # noqa: E402

KINDS = ["asgi", "wsgi"]


class Pages:
    """A running app: ``get`` over HTTP, ``calls`` of a view so far."""

    def __init__(self, base: str, counter: redis.Redis) -> None:
        self.base = base
        self.counter = counter

    def get(self, path: str, **options: Any) -> httpx.Response:
        return httpx.get(self.base + path, timeout=30, **options)

    def calls(self, path: str) -> int:
        return int(self.counter.get(f"pages:calls:{path}") or 0)


@pytest.fixture(scope="module", params=KINDS)
def running(request: pytest.FixtureRequest, redis_url: str) -> Iterator[tuple[str, str]]:
    port = free_port()
    process = serve(redis_url, port, wsgi=request.param == "wsgi")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(base, process)
        yield request.param, base
    finally:
        process.terminate()
        process.wait(15)


@pytest.fixture
def pages(running: tuple[str, str], redis_url: str) -> Iterator[Pages]:
    counter = redis.Redis.from_url(redis_url, socket_timeout=5)
    for key in counter.scan_iter("pages:*"):
        counter.delete(key)
    time.sleep(1.1)  # the workers' memory of page shapes (SHAPE_MEMORY) forgets the last test's
    yield Pages(running[1], counter)
    counter.close()


def test_a_cold_burst_of_200_requests_in_4_processes_calls_the_view_once(pages: Pages) -> None:
    responses = asyncio.run(burst(pages.base, "/page", 200))
    assert pages.calls("/page") == 1
    assert {response.status_code for response in responses} == {200}
    assert len({response.text for response in responses}) == 1
    assert sorted(response.headers["x-cache"] for response in responses).count("MISS") == 1


def test_etag_age_and_304(pages: Pages) -> None:
    first = pages.get("/page")
    etag = first.headers["etag"]
    assert first.status_code == 200 and first.headers["age"] == "0"
    again = pages.get("/page", headers={"if-none-match": f'W/{etag}, "other"'})
    assert again.status_code == 304 and again.content == b""
    assert again.headers["etag"] == etag and "age" in again.headers
    assert pages.get("/page", headers={"if-none-match": '"other"'}).status_code == 200
    assert pages.calls("/page") == 1


def test_a_conditional_request_on_a_cold_page_still_loads_the_whole_page(pages: Pages) -> None:
    cold = pages.get("/page", headers={"if-none-match": '"stale-tag"'})
    assert cold.status_code == 200 and "rendered by call 1" in cold.text
    assert pages.get("/page").text == cold.text


def test_head_is_answered_from_the_get_entry(pages: Pages) -> None:
    head = httpx.head(pages.base + "/page", timeout=30)
    assert head.status_code == 200 and head.content == b""
    get = pages.get("/page")
    assert get.headers["x-cache"] == "HIT" and "rendered by call 1" in get.text
    assert pages.calls("/page") == 1


def test_the_query_is_normalised(pages: Pages) -> None:
    assert pages.get("/page?a=1&b=2").headers["x-cache"] == "MISS"
    assert pages.get("/page?b=2&a=1").headers["x-cache"] == "HIT"
    assert pages.get("/page?a=1&b=3").headers["x-cache"] == "MISS"


def test_a_private_response_is_neither_kept_nor_shared(pages: Pages) -> None:
    responses = asyncio.run(burst(pages.base, "/private", 6))
    assert pages.calls("/private") == 6
    assert len({response.text for response in responses}) == 6  # each its own call's
    assert all(response.headers.get("x-cache") != "HIT" for response in responses)


@pytest.mark.parametrize("header", [{"cookie": "session=1"}, {"authorization": "Bearer t"}])
def test_requests_with_credentials_pass_by_the_cache(pages: Pages, header: dict[str, str]) -> None:
    assert pages.get("/page").headers["x-cache"] == "MISS"
    for _ in range(2):
        passed = pages.get("/page", headers=header)
        assert "x-cache" not in passed.headers
    assert pages.calls("/page") == 3


def test_a_404_is_kept_briefly(pages: Pages) -> None:
    assert pages.get("/missing").status_code == 404
    again = pages.get("/missing")
    assert again.status_code == 404 and again.headers["x-cache"] == "HIT"
    assert pages.calls("/missing") == 1


def test_vary_never_hands_one_language_to_another(pages: Pages) -> None:
    async def mixed() -> list[tuple[str, httpx.Response]]:
        limits = httpx.Limits(max_connections=40, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=pages.base, limits=limits, timeout=30) as client:
            languages = ["en", "fr", "de", "en"] * 10
            got = await asyncio.gather(*(client.get("/language", headers={"accept-language": lang})
                                         for lang in languages))  # fmt: skip
            return list(zip(languages, got, strict=True))

    for _ in range(2):  # cold, then warm
        for language, response in asyncio.run(mixed()):
            assert response.text.startswith(f"language {language} ")
    time.sleep(1.1)  # every worker's memory of the page's shape is now the stored one (SHAPE_MEMORY)
    for language in ("en", "fr"):
        first, second = (pages.get("/language", headers={"accept-language": language}) for _ in range(2))
        assert second.headers["x-cache"] == "HIT" and second.text == first.text
        assert first.text.startswith(f"language {language} ")


def test_an_event_stream_is_streamed_through_and_not_kept(pages: Pages) -> None:
    for _ in range(2):
        response = pages.get("/events")
        assert response.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert response.headers.get("x-cache") == "PASS"
    assert pages.calls("/events") == 2


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.05)


def test_stale_while_revalidate_serves_the_old_page_while_one_refresh_runs(pages: Pages) -> None:
    assert pages.get("/swr").text == "swr call 1"
    time.sleep(1.5)  # past its max-age=1: an expiry, which no event announces
    started = time.monotonic()
    stale = pages.get("/swr")
    assert stale.text == "swr call 1" and time.monotonic() - started < 0.2 + 1.0  # not behind the 0.2 s view
    _until(lambda: pages.get("/swr").text == "swr call 2")
    assert pages.calls("/swr") == 2


def test_stale_if_error_serves_the_old_page_while_the_view_fails(pages: Pages) -> None:
    assert pages.get("/flaky").text == "flaky call 1"
    pages.counter.set("pages:fail", 1)
    time.sleep(1.5)  # past its max-age=1
    failing = pages.get("/flaky")
    assert failing.status_code == 200 and failing.text == "flaky call 1"
    pages.counter.delete("pages:fail")


CHROMIUM = "/usr/bin/chromium"


def test_a_browser_revalidates_and_gets_a_304(redis_url: str, tmp_path: Path) -> None:
    """Headless Chromium loads /page twice with one profile. The page says max-age=0 (the
    shared cache keeps it by s-maxage), so the second navigation asks with If-None-Match,
    and the cache answers 304: uvicorn's access log shows it."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed (Debian's chromium package; .ci/run installs it)")
    counter = redis.Redis.from_url(redis_url, socket_timeout=5)
    for key in counter.scan_iter("pages:*"):
        counter.delete(key)
    port = free_port()
    log = (tmp_path / "access.log").open("w")
    command = ["-m", "uvicorn", "--app-dir", str(EXAMPLES), "--factory", "http_pages:asgi_app", "--port", str(port)]
    server = subprocess.Popen(
        [sys.executable, *command, "--log-level", "info"],
        env={**os.environ, "STAMPEDE_URL": redis_url},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom"]  # fmt: skip
    try:
        wait_until_up(f"http://127.0.0.1:{port}", server)
        for _ in range(2):
            run = subprocess.run([CHROMIUM, *flags, f"http://127.0.0.1:{port}/page"],
                                 capture_output=True, text=True, timeout=90)  # fmt: skip
            assert "rendered by call 1" in run.stdout, run.stderr[-2000:]
    finally:
        server.terminate()
        server.wait(15)
        log.close()
        counter.close()
    requests = [line for line in (tmp_path / "access.log").read_text().splitlines() if '"GET /page ' in line]
    assert len(requests) == 2, requests
    assert " 200" in requests[0] and " 304" in requests[1], requests


def test_a_body_past_max_body_bytes_streams_through_whole(redis_url: str) -> None:
    """A response larger than the cache keeps reaches its request whole, each request's
    own, and nothing is kept (ASGI and WSGI, the cache on the Redis server)."""
    from flask import Flask, Response
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from stampede import Stampede
    from stampede.http import CacheMiddleware, ResponseCache, WSGICacheMiddleware

    chunk, chunks = b"x" * 1000, 50
    calls: list[str] = []

    async def big(request: Any) -> StreamingResponse:
        calls.append("asgi")

        async def body() -> Any:
            for _ in range(chunks):
                yield chunk

        return StreamingResponse(body(), headers={"cache-control": "max-age=60"})

    flask = Flask("big")

    @flask.route("/big")
    def wsgi_big() -> Response:
        calls.append("wsgi")
        return Response((chunk for _ in range(chunks)), headers={"cache-control": "max-age=60"})

    layer = Stampede.from_url(redis_url, namespace="big-bodies")
    try:
        cache = ResponseCache(layer, max_body_bytes=10_000)
        asgi = CacheMiddleware(Starlette(routes=[Route("/big", big)]), cache)
        wsgi = WSGICacheMiddleware(flask.wsgi_app, cache)

        async def asgi_twice() -> list[httpx.Response]:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(asgi), base_url="http://t") as client:
                return [await client.get("/big") for _ in range(2)]

        responses = asyncio.run(asgi_twice())
        with httpx.Client(transport=httpx.WSGITransport(wsgi), base_url="http://t") as client:
            responses += [client.get("/big") for _ in range(2)]
        assert [len(response.content) for response in responses] == [chunks * len(chunk)] * 4
        assert [response.headers["x-cache"] for response in responses] == ["PASS"] * 4
        assert calls == ["asgi", "asgi", "wsgi", "wsgi"]
        assert layer.matching("http:*") == []
    finally:
        layer.close()
