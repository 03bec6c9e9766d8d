"""A FastAPI app whose product endpoint is cached by a dependency: four worker processes
of 16 concurrent requests ask for one cold product at once, and the endpoint runs once;
a write evicts it, and the next read runs it again. ETags and 304s throughout.

    python examples/fastapi_app.py                                  # a throwaway server
    python examples/fastapi_app.py --redis redis://127.0.0.1:6379/0
    uvicorn --app-dir examples --factory fastapi_app:make_app --workers 4   # STAMPEDE_URL names Redis

Requests go through httpx's ASGI transport in each process (no sockets); the endpoint's
calls are counted on the server, so the count is the same whichever process ran it.
Exits non-zero unless the endpoint ran once for the 64 requests.
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
from fastapi import Depends, FastAPI

from stampede import Stampede
from stampede.fastapi import cache, cache_evict, caching
from stampede.testing import server_url

PROCESSES, REQUESTS, HOLD = 4, 16, 0.3  # the endpoint takes HOLD seconds, as a query would


def make_app(url: str | None = None, namespace: str = "shop") -> FastAPI:
    url = url or os.environ["STAMPEDE_URL"]
    app = FastAPI()
    caching(app, Stampede.from_url(url, namespace=namespace))
    counter = redis.asyncio.Redis.from_url(url, socket_timeout=5)
    names = {7: "lamp"}

    @app.get("/products/{product_id}", dependencies=[Depends(cache(ttl=60, cache_control="max-age=10"))])
    async def product(product_id: int) -> dict[str, Any]:
        await counter.incr(f"{namespace}:calls")
        await asyncio.sleep(HOLD)
        return {"id": product_id, "name": names.get(product_id, "?")}

    @app.put("/products/{product_id}", dependencies=[Depends(cache_evict("/products/{product_id}"))])
    async def rename(product_id: int, name: str) -> dict[str, bool]:
        names[product_id] = name
        return {"renamed": True}

    return app


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
        first = await client.get("/products/7")
        again = await client.get("/products/7", headers={"If-None-Match": first.headers["etag"]})
        print(f"  then: {first.json()} (ETag {first.headers['etag']}); with If-None-Match: {again.status_code}")
        await client.put("/products/7", params={"name": "desk"})
        renamed = await client.get("/products/7")
        print(f"  after PUT (cache_evict): {renamed.json()}; endpoint calls: {int(server.get(f'{namespace}:calls'))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: a throwaway server on 127.0.0.1")
    options = parser.parse_args()
    with server_url(options.redis) as url:
        namespace = f"fastapi-{uuid.uuid4().hex[:8]}"
        clean = run_workers(worker, PROCESSES, PROCESSES, url, namespace)
        calls = int(redis.Redis.from_url(url, socket_timeout=5).get(f"{namespace}:calls") or 0)
        print(f"{PROCESSES} processes x {REQUESTS} concurrent requests for one cold product: endpoint calls {calls}")
        asyncio.run(after(url, namespace))
        if not clean or calls != 1:
            sys.exit("expected every request answered, and one endpoint call")
        print("OK")


if __name__ == "__main__":
    main()
