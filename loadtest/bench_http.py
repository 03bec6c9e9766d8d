"""Figures for the HTTP response cache (``stampede.http``) and the Django backend.

    python loadtest/bench_http.py            # starts the servers it needs on 127.0.0.1
    python loadtest/bench_http.py --quick    # shorter, for CI
    python loadtest/bench_http.py --plot loadtest/figures/http.png   # and its picture

1. One Starlette page (its view takes ``--hold`` seconds, as its queries would) served
   three ways, each by uvicorn with ``--workers`` processes: the view uncached, the view
   behind a plain Redis get/set cache (cache-aside in the view), and the view behind
   ``stampede.http.CacheMiddleware``.
   - A cold burst: ``--burst`` concurrent requests for the cold page. View calls (the
     views count themselves on the server) and the slowest response.
   - Warm: requests/s with ``--clients`` concurrent keep-alive connections for
     ``--seconds``, in rounds whose order turns; each ratio is the median of the
     per-round ratios to the plain get/set cache.
2. Django's ``cache.get_or_set`` under the same cold burst (examples/django_site, gunicorn
   with ``--workers`` processes), with ``StampedeCache`` and with django-redis: the
   report's calls and the slowest response.

The warm load comes from wrk (one thread) if it is installed, else from this process
(httpx, asyncio); the bursts always from httpx. All on the same 2 cores as the servers:
the ratios compare like with like; the absolute rates are the machine's.
The last line is JSON with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from http_pages import wait_until_up  # noqa: E402
from plots import Panel, draw  # noqa: E402

from stampede.testing import RedisServer, find_server_binary, free_port  # noqa: E402

KINDS = ("uncached", "plain get/set", "stampede")
HEADERS = {"content-type": "text/html; charset=utf-8", "cache-control": "public, max-age=60"}


def _page(number: int) -> bytes:
    rows = "".join(f"<li>product {n}: {n * 7 % 97} in stock</li>" for n in range(100))
    return f"<!doctype html><title>catalog</title><p>call {number}</p><ul>{rows}</ul>".encode()


def app(kind: str) -> Any:
    """The page, served ``kind``'s way (a uvicorn factory: ``BENCH_URL``, ``BENCH_HOLD``)."""
    import redis.asyncio
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from stampede.http import CacheMiddleware, ResponseCache

    url, hold = os.environ["BENCH_URL"], float(os.environ["BENCH_HOLD"])
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=64, timeout=30)
    client = redis.asyncio.Redis(connection_pool=pool)  # a burst waits for a connection, as stampede's pool does

    async def view(request: Request) -> Response:
        key = f"bench:plain:{request.url.path}"
        if kind == "plain get/set":
            cached = await client.get(key)
            if cached is not None:
                return Response(cached, headers=HEADERS)
        number = await client.incr(f"bench:calls:{kind}")
        await asyncio.sleep(hold)
        body = _page(number)
        if kind == "plain get/set":
            await client.set(key, body, ex=60)
        return Response(body, headers=HEADERS)

    page = Starlette(routes=[Route("/catalog", view)])
    return CacheMiddleware(page, ResponseCache.from_url(url, namespace="bench")) if kind == "stampede" else page


def app_uncached() -> Any:
    return app("uncached")


def app_plain() -> Any:
    return app("plain get/set")


def app_stampede() -> Any:
    return app("stampede")


FACTORIES = {"uncached": "app_uncached", "plain get/set": "app_plain", "stampede": "app_stampede"}


def start(command: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", *command], env={**os.environ, **env}, cwd=cwd)


async def cold_burst(base: str, path: str, requests: int) -> dict[str, Any]:
    """``requests`` concurrent GETs, each on a connection of its own: statuses and the
    slowest response."""
    limits = httpx.Limits(max_connections=requests, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:

        async def one() -> tuple[int, float]:
            started = time.perf_counter()
            response = await client.get(path)
            return response.status_code, time.perf_counter() - started

        done = await asyncio.gather(*(one() for _ in range(requests)))
    return {"statuses": sorted({status for status, _ in done}), "slowest_ms": round(max(t for _, t in done) * 1000)}


def warm_rate(base: str, path: str, clients: int, seconds: float) -> float:
    """Requests/s of ``clients`` concurrent keep-alive connections for ``seconds``: by
    wrk (one thread) when it is installed (Debian's wrk), else by httpx from this process."""
    if shutil.which("wrk"):
        duration = f"{max(1, round(seconds))}s"
        done = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{duration}", base + path],
                              capture_output=True, text=True, timeout=seconds + 30, check=True)  # fmt: skip
        if "Non-2xx" in done.stdout or "Socket errors" in done.stdout:
            raise RuntimeError(f"wrk saw errors: {done.stdout}")
        return float(re.search(r"Requests/sec:\s+([\d.]+)", done.stdout).group(1))  # type: ignore[union-attr]
    return asyncio.run(_httpx_rate(base, path, clients, seconds))


async def _httpx_rate(base: str, path: str, clients: int, seconds: float) -> float:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60) as client:
        deadline = time.perf_counter() + seconds
        counts = [0] * clients

        async def loop(index: int) -> None:
            while time.perf_counter() < deadline:
                response = await client.get(path)
                assert response.status_code == 200
                counts[index] += 1

        started = time.perf_counter()
        await asyncio.gather(*(loop(index) for index in range(clients)))
        return sum(counts) / (time.perf_counter() - started)


def pages(url: str, options: argparse.Namespace) -> dict[str, Any]:
    counter = redis.Redis.from_url(url)
    servers: dict[str, tuple[str, subprocess.Popen[bytes]]] = {}
    env = {"BENCH_URL": url, "BENCH_HOLD": str(options.hold)}
    try:
        for kind in KINDS:
            port = free_port()
            command = ["uvicorn", "--app-dir", str(ROOT / "loadtest"), "--factory", f"bench_http:{FACTORIES[kind]}",
                       "--workers", str(options.workers), "--port", str(port), "--log-level", "warning",
                       "--no-access-log"]  # fmt: skip
            servers[kind] = (f"http://127.0.0.1:{port}", start(command, env))
        for base, process in servers.values():
            wait_until_up(base, process, path="/catalog", expect=200)
        counter.delete(*[f"bench:calls:{kind}" for kind in KINDS], "bench:plain:/catalog")
        for key in counter.scan_iter("bench:{*"):
            counter.delete(key)
        figures: dict[str, Any] = {}
        for kind, (base, _) in servers.items():
            burst = asyncio.run(cold_burst(base, "/catalog", options.burst))
            figures[kind] = {"cold burst": {**burst, "view calls": int(counter.get(f"bench:calls:{kind}") or 0)}}
        rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
        ratios: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for round_number in range(options.rounds):
            order = KINDS[round_number % 3 :] + KINDS[: round_number % 3]
            measured = {kind: warm_rate(servers[kind][0], "/catalog", options.clients, options.seconds)
                        for kind in order}  # fmt: skip
            for kind in KINDS:
                rates[kind].append(measured[kind])
                ratios[kind].append(measured[kind] / measured["plain get/set"])
        for kind in KINDS:
            figures[kind]["warm requests/s"] = round(statistics.median(rates[kind]))
            figures[kind]["warm ratio to plain get/set"] = round(statistics.median(ratios[kind]), 3)
        return figures
    finally:
        for _, process in servers.values():
            process.terminate()
        for _, process in servers.values():
            process.wait(15)
        counter.close()


def django(url: str, options: argparse.Namespace) -> dict[str, Any]:
    counter = redis.Redis.from_url(url)
    figures: dict[str, Any] = {}
    try:
        for backend in ("stampede", "django-redis"):
            for key in counter.scan_iter("*"):
                counter.delete(key)
            port = free_port()
            site = ROOT / "examples" / "django_site"
            command = ["gunicorn", "--chdir", str(site), "-w", str(options.workers), "--threads", "16",
                       "-b", f"127.0.0.1:{port}", "--log-level", "warning", "wsgi:application"]  # fmt: skip
            env = {"STAMPEDE_URL": url, "SITE_CACHE": backend, "SITE_HOLD": str(options.hold)}
            process = start(command, env, cwd=ROOT / "examples" / "django_site")
            try:
                base = f"http://127.0.0.1:{port}"
                wait_until_up(base, process)
                burst = asyncio.run(cold_burst(base, "/report", options.burst))
                figures[backend] = {**burst, "report calls": int(counter.get("site:calls:report") or 0)}
            finally:
                process.terminate()
                process.wait(15)
    finally:
        counter.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="server processes (2: the machine's cores)")
    parser.add_argument("--hold", type=float, default=0.5, help="seconds the view takes")
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--plot", help="also draw the cold bursts and the warm rates to this PNG")
    options = parser.parse_args()
    if options.quick:
        options.burst, options.clients, options.seconds, options.rounds = 50, 8, 0.5, 1
    has_peer = importlib.util.find_spec("django_redis") is not None
    with RedisServer(find_server_binary()) as server:
        paged = pages(server.url, options)
        if not has_peer:
            print("django-redis is not installed (pip install django-redis): the Django rows are left out")
            djangoed: dict[str, Any] = {}
        else:
            djangoed = django(server.url, options)
    generator = "wrk" if shutil.which("wrk") else "httpx"
    print(f"A page whose view takes {options.hold} s, uvicorn with {options.workers} workers (warm load: {generator}):")
    for kind in KINDS:
        row = paged[kind]
        cold = row["cold burst"]
        print(f"  {kind:<14} cold burst of {options.burst}: {cold['view calls']:>3} view calls, slowest "
              f"{cold['slowest_ms']:>5} ms; warm {row['warm requests/s']:>6} requests/s "
              f"({row['warm ratio to plain get/set']:.3f}x the plain get/set cache)")  # fmt: skip
    if djangoed:
        print(f"Django cache.get_or_set, cold burst of {options.burst}, gunicorn with {options.workers} workers:")
        for backend, row in djangoed.items():
            print(f"  {backend:<14} {row['report calls']:>3} report calls, slowest {row['slowest_ms']:>5} ms")
    print(json.dumps({"pages": paged, "django get_or_set": djangoed, "warm load generator": generator}))
    if options.plot:
        plot(paged, djangoed, options, generator, options.plot)
        print(f"plot: {options.plot}")


def plot(
    paged: dict[str, Any], djangoed: dict[str, Any], options: argparse.Namespace, generator: str, path: str
) -> None:
    """One PNG: the cold burst's view (or report) calls and slowest response for each way
    of caching the page and for each Django backend, and the warm page's requests/s, all
    measured in the same run."""
    bursts = {f"{kind} page": paged[kind]["cold burst"] for kind in KINDS}
    bursts |= {f"{backend} (Django)": {"view calls": row["report calls"], "slowest_ms": row["slowest_ms"]}
               for backend, row in djangoed.items()}  # fmt: skip
    names = list(bursts)
    calls = Panel(names, f"view calls in a cold burst of {options.burst} (1 is the promise)",
                  [("", [row["view calls"] for row in bursts.values()])],
                  notes=[str(row["view calls"]) for row in bursts.values()])  # fmt: skip
    slowest = Panel(names, f"slowest response, ms (the view takes {options.hold * 1000:.0f})",
                    [("", [row["slowest_ms"] for row in bursts.values()])],
                    notes=[f"{row['slowest_ms']:.0f}" for row in bursts.values()])  # fmt: skip
    rates = [paged[kind]["warm requests/s"] for kind in KINDS]
    warm = Panel([f"{kind} page" for kind in KINDS], "warm requests/s (higher is better)", [("", rates)],
                 notes=[f"{rate:,.0f}" for rate in rates])  # fmt: skip
    title = (f"One page, uvicorn and gunicorn with {options.workers} workers; the warm load from {generator}, "
             "on the same cores")  # fmt: skip
    draw(path, title, [calls, slowest, warm])


if __name__ == "__main__":
    main()
