"""An asyncio web app (Starlette) whose endpoint is an async cached loader.

    python examples/web_app.py            # a throwaway Redis server, the app on 127.0.0.1:8000
    python examples/web_app.py --check    # the app on a free port, a burst of requests, the result
    python examples/web_app.py --redis redis://127.0.0.1:6379/0

Endpoints:

    GET  /categories/{shop}              the shop's category map, from a slow "database"
    POST /categories/{shop}/invalidate   the shop's categories changed: drop the entry
    GET  /stats                          database queries so far, and the layer's counters

``--check`` sends a burst of concurrent requests for one cold shop over HTTP, then an
invalidation and another burst, and shows that each burst cost one database query.
Needs the dev extra (starlette, uvicorn, httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import sys
from typing import Any, AsyncIterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from stampede import Stampede
from stampede.testing import RedisServer, find_server_binary, free_port

DATABASE_QUERY_SECONDS = 0.05


def build_app(layer: Stampede) -> Starlette:
    queries: collections.Counter[str] = collections.Counter()

    @layer.cached_loader("category-map:{shop}", ttl=300)
    async def category_map(shop: str) -> dict[str, Any]:
        """The expensive query: every call here is a database round trip."""
        queries[shop] += 1
        await asyncio.sleep(DATABASE_QUERY_SECONDS)
        return {"shop": shop, "categories": {"books": ["novels", "comics"], "games": ["board", "video"]}}

    async def categories(request: Request) -> JSONResponse:
        return JSONResponse(await category_map(request.path_params["shop"]))

    async def invalidate(request: Request) -> JSONResponse:
        await category_map.invalidate(request.path_params["shop"])
        return JSONResponse({"invalidated": request.path_params["shop"]})

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse({"database_queries": dict(queries), "cache": layer.stats()})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await layer.aclose()  # this loop's connections, and the layer's threads

    return Starlette(
        routes=[
            Route("/categories/{shop}", categories),
            Route("/categories/{shop}/invalidate", invalidate, methods=["POST"]),
            Route("/stats", stats),
        ],
        lifespan=lifespan,
    )


async def check(layer: Stampede, requests: int) -> bool:
    """Serve the app on a free port and show what a burst of requests costs."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(layer), host="127.0.0.1", port=port, log_level="warning"))
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
                (await http.post("/categories/acme/invalidate")).raise_for_status()
            responses = await asyncio.gather(*(http.get("/categories/acme") for _ in range(requests)))
            bodies = {response.text for response in responses if response.status_code == 200}
            queries = (await http.get("/stats")).json()["database_queries"].get("acme", 0)
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
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--check", action="store_true", help="serve on a free port, send a burst, report, exit")
    parser.add_argument("--requests", type=int, default=200)
    options = parser.parse_args()

    server = None
    if options.redis is None and find_server_binary() is not None:
        server = RedisServer().start()
    url = options.redis or (server.url if server else None)
    layer = Stampede.from_url(url, namespace="web") if url else Stampede(namespace="web")
    print(f"cache: {url or 'embedded (no Redis server found)'}")
    try:
        if options.check:
            sys.exit(0 if asyncio.run(check(layer, options.requests)) else 1)
        print(f"serving on http://127.0.0.1:{options.port}/categories/acme (Ctrl-C to stop)")
        uvicorn.run(build_app(layer), host="127.0.0.1", port=options.port, log_level="info")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
