"""A Litestar app whose stores are on stampede (``StampedePlugin``): four worker processes
of 16 concurrent requests ask for one cold product at once, and its cached handler runs
once; a write deletes the response, and the next read runs it again. Its sessions are
kept on the same server.

    python examples/litestar_app.py                                  # a throwaway server
    python examples/litestar_app.py --redis redis://127.0.0.1:6379/0
    uvicorn --app-dir examples --factory litestar_app:make_app --workers 4   # STAMPEDE_URL names Redis

Requests go through httpx's ASGI transport in each process (no sockets); the handler's
calls are counted on the server, so the count is the same whichever process ran it.
Exits non-zero unless the handler ran once for the 64 requests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from typing import Any

import httpx
import redis
import redis.asyncio
from bursts import run_workers
from litestar import Litestar, Request, get, put
from litestar.middleware.session.server_side import ServerSideSessionConfig
from litestar.params import FromPath, FromQuery

from stampede import Stampede
from stampede.litestar import StampedePlugin
from stampede.testing import server_url

PROCESSES, REQUESTS, HOLD = 4, 16, 0.3  # the handler takes HOLD seconds, as a query would


def make_app(url: str | None = None, namespace: str = "shop") -> Litestar:
    url = url or os.environ["STAMPEDE_URL"]
    layer = Stampede.from_url(url, namespace=namespace, jitter=0)  # a store's values expire when told to
    counter = redis.asyncio.Redis.from_url(url, socket_timeout=5)
    names = {7: "lamp"}

    @get("/products/{product_id:int}", cache=60)
    async def product(product_id: FromPath[int]) -> dict[str, Any]:
        await counter.incr(f"{namespace}:calls")
        await asyncio.sleep(HOLD)
        return {"id": product_id, "name": names.get(product_id, "?")}

    @put("/products/{product_id:int}")
    async def rename(product_id: FromPath[int], name: FromQuery[str], request: Request) -> dict[str, bool]:
        names[product_id] = name
        await request.app.stores.get("response_cache").delete(f"GET/products/{product_id}")
        return {"renamed": True}

    @get("/visits")
    async def visits(request: Request) -> dict[str, int]:
        count = request.session.get("visits", 0) + 1
        request.set_session({"visits": count})
        return {"visits": count}

    return Litestar(
        [product, rename, visits],
        plugins=[StampedePlugin(layer)],
        middleware=[ServerSideSessionConfig().middleware],
        logging_config=None,  # the example prints what it shows
    )


async def burst(url: str, namespace: str) -> None:
    app = make_app(url, namespace)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as client:
        responses = await asyncio.gather(*(client.get("/products/7") for _ in range(REQUESTS)))
    assert {response.status_code for response in responses} == {200}


def worker(url: str, namespace: str, start: Any) -> None:
    start.wait()
    asyncio.run(burst(url, namespace))


async def after(url: str, namespace: str) -> None:
    server = redis.Redis.from_url(url, socket_timeout=5)
    app = make_app(url, namespace)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as client:
        print(f"  then: {(await client.get('/products/7')).json()}")
        await client.put("/products/7", params={"name": "desk"})
        renamed = await client.get("/products/7")
        calls = int(server.get(f"{namespace}:calls") or 0)
        print(f"  after PUT (its response deleted): {renamed.json()}; handler calls: {calls}")
        visits = [(await client.get("/visits")).json()["visits"] for _ in range(3)]
        print(f"  a session kept on the layer: visits {visits}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: a throwaway server on 127.0.0.1")
    options = parser.parse_args()
    with server_url(options.redis) as url:
        namespace = f"litestar-{uuid.uuid4().hex[:8]}"
        clean = run_workers(worker, PROCESSES, PROCESSES, url, namespace)
        calls = int(redis.Redis.from_url(url, socket_timeout=5).get(f"{namespace}:calls") or 0)
        print(f"{PROCESSES} processes x {REQUESTS} concurrent requests for one cold product: handler calls {calls}")
        asyncio.run(after(url, namespace))
        if not clean or calls != 1:
            sys.exit("expected every request answered, and one handler call")
        print("OK")


if __name__ == "__main__":
    main()
