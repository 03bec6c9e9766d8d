"""Pages behind stampede's HTTP response cache: the same views as an ASGI app (Starlette)
and a WSGI app (Flask), each wrapped in the cache's middleware.

    python examples/http_pages.py             # a throwaway Redis server, 4 uvicorn workers, a cold burst
    python examples/http_pages.py --wsgi      # the same under 4 gunicorn workers
    uvicorn --app-dir examples --factory http_pages:asgi_app --workers 4   # STAMPEDE_URL names Redis

Each view counts its calls on the Redis server (``INCR pages:calls:<path>``), so the count
is the same whichever worker process served it, and takes ``PAGES_HOLD`` seconds (0.2),
as a page's queries would:

    GET /page       Cache-Control: public, max-age=0, s-maxage=60: the shared cache keeps
                    it a minute, a browser revalidates it every time (ETag, 304)
    GET /swr        max-age=1, stale-while-revalidate=30: served stale while one refresh runs
    GET /flaky      max-age=1, stale-if-error=60: raises while ``pages:fail`` is set
    GET /missing    404 with no Cache-Control: kept 10 s (negative caching)
    GET /private    Cache-Control: private: never kept, never shared
    GET /language   Vary: Accept-Language
    GET /events     text/event-stream: streamed through, never kept
    GET /calls      the view calls so far, by path (not cached)

The burst (the default): 200 concurrent requests for the cold /page, over HTTP, through
4 worker processes. It prints the view calls (1) and exits non-zero otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from stampede.http import CacheMiddleware, ResponseCache, WSGICacheMiddleware
from stampede.testing import RedisServer, find_server_binary, free_port

HOLD = float(os.environ.get("PAGES_HOLD", "0.2"))
HERE = Path(__file__).parent


def _page(path: str, counter: redis.Redis, language: str | None = None) -> tuple[int, dict[str, str], str]:
    """One view: (status, headers, body) for ``path``, counted on the server."""
    if path == "/calls":
        calls = {key.decode().removeprefix("pages:calls:"): int(counter.get(key) or 0)
                 for key in counter.scan_iter("pages:calls:*")}  # fmt: skip
        return 200, {"content-type": "application/json"}, json.dumps(calls)
    number = counter.incr(f"pages:calls:{path}")
    time.sleep(HOLD)
    html = {"content-type": "text/html; charset=utf-8"}
    if path == "/page":
        body = f"<!doctype html><title>page</title><p>rendered by call {number}</p>"
        return 200, {**html, "cache-control": "public, max-age=0, s-maxage=60"}, body
    if path == "/swr":
        return 200, {**html, "cache-control": "max-age=1, stale-while-revalidate=30"}, f"swr call {number}"
    if path == "/flaky":
        if counter.exists("pages:fail"):
            raise RuntimeError("the database is down")
        return 200, {**html, "cache-control": "max-age=1, stale-if-error=60"}, f"flaky call {number}"
    if path == "/private":
        return 200, {**html, "cache-control": "private, max-age=60"}, f"private call {number}"
    if path == "/language":
        headers = {**html, "cache-control": "max-age=60", "vary": "Accept-Language"}
        return 200, headers, f"language {language} call {number}"
    return 404, html, f"no page at {path}"


def asgi_app() -> Any:
    """The Starlette app, wrapped (``STAMPEDE_URL``: the Redis server)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    url = os.environ["STAMPEDE_URL"]
    counter = redis.Redis.from_url(url, socket_timeout=5)

    async def view(request: Request) -> Response:
        path = request.url.path
        if path == "/events":
            await asyncio.to_thread(counter.incr, "pages:calls:/events")

            async def events() -> Any:
                for number in range(3):
                    yield f"data: {number}\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        language = request.headers.get("accept-language")
        status, headers, body = await asyncio.to_thread(_page, path, counter, language)
        return Response(body, status_code=status, headers=headers)

    app = Starlette(routes=[Route("/{path:path}", view)])
    return CacheMiddleware(app, page_cache(url))


def page_cache(url: str) -> ResponseCache:
    """The workers' response cache. The burst opens a connection per request at once: on
    a busy 2-core machine one took past the layer's 1 s connect timeout, and its request
    failed, so this demo allows 5 s."""
    return ResponseCache.from_url(url, namespace="pages", socket_connect_timeout=5.0)


def wsgi_app() -> Any:
    """The Flask app, wrapped (``STAMPEDE_URL``: the Redis server)."""
    from flask import Flask, Response, request

    url = os.environ["STAMPEDE_URL"]
    counter = redis.Redis.from_url(url, socket_timeout=5)
    app = Flask("http_pages")

    @app.route("/", defaults={"path": ""})
    @app.route("/<path:path>")
    def view(path: str) -> Response:
        if request.path == "/events":
            counter.incr("pages:calls:/events")
            return Response((f"data: {n}\n\n" for n in range(3)), mimetype="text/event-stream")
        status, headers, body = _page(request.path, counter, request.headers.get("Accept-Language"))
        return Response(body, status=status, headers=headers)

    app.wsgi_app = WSGICacheMiddleware(app.wsgi_app, page_cache(url))  # type: ignore[method-assign]
    return app


def serve(url: str, port: int, wsgi: bool, workers: int = 4) -> subprocess.Popen[bytes]:
    """The app under ``workers`` worker processes of uvicorn (or gunicorn) on ``port``."""
    env = {**os.environ, "STAMPEDE_URL": url}
    if wsgi:
        command = ["-m", "gunicorn", "--chdir", str(HERE), "-w", str(workers), "--threads", "16",
                   "-b", f"127.0.0.1:{port}", "--log-level", "warning", "http_pages:wsgi_app()"]  # fmt: skip
    else:
        command = ["-m", "uvicorn", "--app-dir", str(HERE), "--factory", "http_pages:asgi_app", "--workers",
                   str(workers), "--port", str(port), "--log-level", "warning"]  # fmt: skip
    return subprocess.Popen([sys.executable, *command], env=env)


def wait_until_up(
    base: str, process: subprocess.Popen[bytes], timeout: float = 30.0, path: str = "/calls", expect: int = 200
) -> None:
    """Wait until ``path`` answers ``expect`` (a server with several workers answers as
    soon as one is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            if httpx.get(f"{base}{path}", timeout=5).status_code == expect:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the server did not answer within {timeout} s")


async def burst(base: str, path: str, requests: int) -> list[httpx.Response]:
    """``requests`` concurrent GETs of ``path``, each on a connection of its own."""
    limits = httpx.Limits(max_connections=requests, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
        return list(await asyncio.gather(*(client.get(path) for _ in range(requests))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wsgi", action="store_true", help="Flask under gunicorn instead of Starlette under uvicorn")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    options = parser.parse_args()
    with RedisServer(find_server_binary()) as server:
        port = free_port()
        process = serve(server.url, port, options.wsgi, options.workers)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_until_up(base, process)
            responses = asyncio.run(burst(base, "/page", options.requests))
            calls = httpx.get(f"{base}/calls").json().get("/page", 0)
        finally:
            process.terminate()
            process.wait(15)
    bodies = {response.text for response in responses}
    statuses = {response.status_code for response in responses}
    server_kind = "gunicorn (WSGI)" if options.wsgi else "uvicorn (ASGI)"
    print(f"{options.requests} concurrent requests for a cold page, {options.workers} {server_kind} workers:")
    print(f"  view calls: {calls}, statuses: {sorted(statuses)}, distinct bodies: {len(bodies)}")
    sys.exit(0 if calls == 1 and statuses == {200} and len(bodies) == 1 else 1)


if __name__ == "__main__":
    main()
