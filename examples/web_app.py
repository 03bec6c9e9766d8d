"""An asyncio web app (Starlette) whose endpoints are async cached loaders over the shop database.

    python examples/web_app.py            # a throwaway Redis server, the app on 127.0.0.1:8000
    python examples/web_app.py --check    # the app on a free port, a burst of requests, the result
    python examples/web_app.py --redis redis://127.0.0.1:6379/0 --db shop.sqlite --ttl 3

Endpoints:

    GET  /categories/{shop}              the shop's category map (404 for an unknown shop)
    GET  /products/{id}                  one product (404 for an unknown id)
    POST /categories/{shop}/invalidate   the shop's categories changed: drop the entry
    GET  /stats                          database queries so far, and the layer's counters
    GET  /metrics                        the layer's Prometheus metrics (stampede.prometheus)

The database is examples/shop.py's SQLite file (a new one unless ``--db`` names one),
queried in a worker thread; it logs every query. ``--protection off`` serves the same
endpoints through plain cache-aside (examples/cache_aside.py) instead: the load test's
baseline. ``--check`` sends a burst of concurrent requests for one cold shop over HTTP,
then an invalidation and another burst, and shows that each burst cost one query.
Needs the examples extra (starlette, uvicorn, httpx, prometheus-client).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio
import uvicorn
from cache_aside import aread_through
from cache_state import cache_state
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from shop import CATEGORY_MAP_ENTRY, PRODUCT_ENTRY, ShopDatabase
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from stampede import Stampede
from stampede.prometheus import PrometheusMetrics
from stampede.testing import RedisServer, find_server_binary, free_port

Query = Callable[[Any], Awaitable[Any]]


def protected_queries(layer: Stampede, database: ShopDatabase, ttl: float) -> tuple[Query, Query, Query]:
    """The endpoints' queries as cached loaders: one database query per key per expiry,
    across every process on the same Redis (the load test's direct callers included)."""

    @layer.cached_loader(CATEGORY_MAP_ENTRY, ttl=ttl, null_ttl=ttl)
    async def category_map(shop: str) -> dict[str, list[str]] | None:
        return await asyncio.to_thread(database.category_map, shop)

    @layer.cached_loader(PRODUCT_ENTRY, ttl=ttl, null_ttl=ttl)
    async def product(product_id: int) -> dict[str, Any] | None:
        return await asyncio.to_thread(database.product, product_id)

    return category_map, product, category_map.invalidate


def unprotected_queries(client: redis.asyncio.Redis, database: ShopDatabase, ttl: float) -> tuple[Query, Query, Query]:
    """The same queries through plain cache-aside: the baseline with no protection."""

    async def category_map(shop: str) -> Any:
        return await aread_through(client, "off:" + CATEGORY_MAP_ENTRY.format(shop=shop), ttl,
                                   lambda: asyncio.to_thread(database.category_map, shop))  # fmt: skip

    async def product(product_id: int) -> Any:
        return await aread_through(client, "off:" + PRODUCT_ENTRY.format(product_id=product_id), ttl,
                                   lambda: asyncio.to_thread(database.product, product_id))  # fmt: skip

    async def invalidate(shop: str) -> None:
        await client.delete("off:" + CATEGORY_MAP_ENTRY.format(shop=shop))

    return category_map, product, invalidate


def build_app(
    layer: Stampede, database: ShopDatabase, queries: tuple[Query, Query, Query], registry: CollectorRegistry
) -> Starlette:
    category_map, product, invalidate_categories = queries

    def found_or_404(value: Any, what: str) -> JSONResponse:
        return JSONResponse({"error": f"no such {what}"}, 404) if value is None else JSONResponse(value)

    async def categories(request: Request) -> JSONResponse:
        return found_or_404(await category_map(request.path_params["shop"]), "shop")

    async def products(request: Request) -> JSONResponse:
        return found_or_404(await product(request.path_params["product_id"]), "product")

    async def invalidate(request: Request) -> JSONResponse:
        await invalidate_categories(request.path_params["shop"])
        return JSONResponse({"invalidated": request.path_params["shop"]})

    async def stats(request: Request) -> JSONResponse:
        counts: dict[str, int] = {}
        for query in await asyncio.to_thread(database.queries):
            counts[query.what] = counts.get(query.what, 0) + 1
        return JSONResponse({"database_queries": counts, "cache": layer.stats()})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await layer.aclose()  # this loop's connections, and the layer's threads

    return Starlette(
        routes=[
            Route("/categories/{shop}", categories),
            Route("/products/{product_id:int}", products),
            Route("/categories/{shop}/invalidate", invalidate, methods=["POST"]),
            Route("/stats", stats),
            Route("/metrics", metrics),
        ],
        lifespan=lifespan,
    )


# Connections idle between a client's bursts stay open: with uvicorn's 5 s keep-alive, a
# burst that took that long on a busy machine let the server close a connection just as
# the client reused it ("Server disconnected without sending a response"; CI's suite).
KEEP_ALIVE = 120


async def check(app: Starlette, requests: int) -> bool:
    """Serve the app on a free port and show what a burst of requests costs."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=KEEP_ALIVE)
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        if serving.done():
            serving.result()  # raises what stopped it
        await asyncio.sleep(0.01)
    base = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_connections=100)
    ok = True
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as http:
        for step in ("cold", "after invalidate"):
            if step == "after invalidate":
                (await http.post("/categories/shop-1/invalidate")).raise_for_status()
            responses = await asyncio.gather(*(http.get("/categories/shop-1") for _ in range(requests)))
            bodies = {response.text for response in responses if response.status_code == 200}
            queries = (await http.get("/stats")).json()["database_queries"].get("category_map shop-1", 0)
            print(f"{requests} concurrent requests ({step}): {len(bodies)} distinct body, "
                  f"database queries so far: {queries}")  # fmt: skip
            ok = ok and len(bodies) == 1 and all(response.status_code == 200 for response in responses)
        ok = ok and queries == 2
        print("cache counters:", (await http.get("/stats")).json()["cache"])
    server.should_exit = True
    await serving
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--db", type=Path, help="the shop database (made if missing); default: a new one")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--ttl", type=float, default=300.0, help="seconds an entry stays cached")
    parser.add_argument("--protection", choices=("on", "off"), default="on")
    parser.add_argument("--check", action="store_true", help="serve on a free port, send a burst, report, exit")
    parser.add_argument("--requests", type=int, default=200)
    options = parser.parse_args()

    with contextlib.ExitStack() as cleanup:
        url = options.redis
        if url is None and find_server_binary() is not None:
            url = cleanup.enter_context(RedisServer()).url
        if options.protection == "off" and url is None:
            parser.error("--protection off needs a Redis server")
        if options.db is None:
            options.db = Path(cleanup.enter_context(tempfile.TemporaryDirectory())) / "shop.sqlite"
        database = ShopDatabase(options.db) if options.db.exists() else ShopDatabase.create(options.db)
        registry = CollectorRegistry()  # this app's: one PrometheusMetrics per registry
        observers = [PrometheusMetrics(registry)]
        layer = (
            Stampede.from_url(url, namespace="shop", observers=observers)
            if url
            else Stampede(namespace="shop", observers=observers)
        )
        if options.protection == "on":
            queries = protected_queries(layer, database, options.ttl)
            if url:  # the query log notes what the cache held (read by the load test)
                category_map, product, _ = queries
                database.note = cache_state(layer, url, {
                    "category_map": category_map.key,  # type: ignore[attr-defined]
                    "product": lambda argument: product.key(int(argument)),  # type: ignore[attr-defined]
                })  # fmt: skip
        else:
            client = redis.asyncio.Redis.from_url(url, socket_timeout=5)
            queries = unprotected_queries(client, database, options.ttl)
        app = build_app(layer, database, queries, registry)
        print(f"cache: {url or 'embedded (no Redis server found)'}, protection {options.protection}; "
              f"database: {database.path}")  # fmt: skip
        if options.check:
            sys.exit(0 if asyncio.run(check(app, options.requests)) else 1)
        print(f"serving on http://127.0.0.1:{options.port}/categories/shop-1 (Ctrl-C to stop)", flush=True)
        # uvicorn raises a SIGTERM it caught again once it has shut down, and Python's own
        # handler would end the process there, before the throwaway server is stopped.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        uvicorn.run(app, host="127.0.0.1", port=options.port, log_level="warning", access_log=False,
                    timeout_keep_alive=KEEP_ALIVE)  # fmt: skip


if __name__ == "__main__":
    main()
