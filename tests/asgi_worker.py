"""A worker process for the FastAPI and Litestar tests: an app (``--app``) whose product
handler is cached by its framework's integration, over a layer at ``--url``, asked for
one cold product by ``--callers`` concurrent requests (through httpx's ASGI transport)
once it reads "go".

The handler counts itself on the server (``INCR <namespace>:calls``) and takes ``--hold``
seconds, as a query would. Prints "ready" once connected, then one JSON line: what each
request got (status, body, ETag) and the layer's counters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import redis.asyncio

from stampede import Stampede

Product = Callable[[int], Awaitable[dict[str, int]]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--app", choices=["fastapi", "litestar"], required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--hold", type=float, default=0.3)
    options = parser.parse_args()
    asyncio.run(run(options))


def fastapi_app(layer: Stampede, product: Product) -> Any:
    from fastapi import Depends, FastAPI

    from stampede.fastapi import cache, caching

    app = FastAPI()
    caching(app, layer)

    @app.get("/products/{product_id}", dependencies=[Depends(cache(ttl=60))])
    async def cached(product_id: int) -> dict[str, int]:
        return await product(product_id)

    return app


def litestar_app(layer: Stampede, product: Product) -> Any:
    from litestar import Litestar, get
    from litestar.params import FromPath

    from stampede.litestar import StampedePlugin

    @get("/products/{product_id:int}", cache=60)
    async def cached(product_id: FromPath[int]) -> dict[str, int]:
        return await product(product_id)

    return Litestar([cached], plugins=[StampedePlugin(layer)], logging_config=None)


async def run(options: argparse.Namespace) -> None:
    layer = Stampede.from_url(options.url, namespace=options.namespace, jitter=0)
    counter = redis.asyncio.Redis.from_url(options.url, socket_timeout=5)

    async def product(product_id: int) -> dict[str, int]:
        number = await counter.incr(f"{options.namespace}:calls")
        await asyncio.sleep(options.hold)
        return {"id": product_id, "rendered_by_call": number}

    app = (fastapi_app if options.app == "fastapi" else litestar_app)(layer, product)
    await layer.cached_loader("warm-up:{n}")(_nothing).peek(0)  # connected before "go"
    print("ready", flush=True)
    if await asyncio.to_thread(sys.stdin.readline) != "go\n":
        return
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        responses = await asyncio.gather(*(client.get("/products/7") for _ in range(options.callers)))
    got = [[response.status_code, response.text, response.headers.get("etag")] for response in responses]
    print(json.dumps({"got": got, "stats": layer.stats()}), flush=True)
    await counter.aclose()
    await layer.aclose()


async def _nothing(n: int) -> None:
    return None


if __name__ == "__main__":
    main()
