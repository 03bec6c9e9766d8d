"""``stampede.fastapi``: ``cache()`` and ``cache_evict()`` as FastAPI dependencies: ETags
and 304s, eviction before the write's response, what is never shared, and
``dependency_overrides`` (one endpoint call for 64 requests in 4 processes:
test_asgi_collapse.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from stampede import ConfigError, Stampede
from stampede.testing import RedisServer

pytest.importorskip("fastapi", reason="FastAPI is not installed (the dev extra has it)")

import httpx
from fastapi import Depends, FastAPI, Request, Response

from stampede.fastapi import cache, cache_evict, caching


class Shop:
    """An app over a layer: a cached product endpoint counting its calls, a write
    endpoint evicting it, and what its tests change."""

    def __init__(self, layer: Stampede, **cached: Any) -> None:
        self.app = FastAPI()
        caching(self.app, layer)
        self.calls: list[str] = []
        self.names = {1: "lamp", 2: "desk"}
        self.status = 200
        self.gate: asyncio.Event | None = None
        self.product_cache = cache(ttl=60, **cached)

        @self.app.api_route(  # FastAPI answers HEAD with 405 unless a route names it
            "/products/{product_id}", methods=["GET", "HEAD"], dependencies=[Depends(self.product_cache)]
        )
        async def product(product_id: int, response: Response, page: int = 1) -> dict[str, Any]:
            self.calls.append(f"{product_id}/{page}")
            name = self.names[product_id]
            if self.gate is not None:
                await self.gate.wait()
            response.status_code = self.status
            return {"id": product_id, "name": name, "page": page}

        @self.app.put("/products/{product_id}", dependencies=[Depends(cache_evict("/products/{product_id}"))])
        async def rename(product_id: int, name: str) -> dict[str, bool]:
            self.names[product_id] = name
            return {"renamed": True}


@asynccontextmanager
async def client_of(
    redis_url: str, root_path: str = "", **cached: Any
) -> AsyncIterator[tuple[Shop, httpx.AsyncClient]]:
    layer = Stampede.from_url(redis_url, namespace=f"fa-{uuid.uuid4().hex[:8]}")
    shop = Shop(layer, **cached)
    transport = httpx.ASGITransport(app=shop.app, root_path=root_path)
    try:
        async with httpx.AsyncClient(transport=transport, base_url=f"http://shop{root_path}") as client:
            yield shop, client
    finally:
        await layer.aclose()


def test_etags_304s_and_cache_control(redis_url: str) -> None:
    async def main() -> None:
        async with client_of(redis_url, cache_control="public, max-age=60") as (shop, client):
            first = await client.get("/products/1")
            again = await client.get("/products/1", headers={"If-None-Match": first.headers["etag"]})
            other = await client.get("/products/1", headers={"If-None-Match": '"another"'})
            assert first.status_code == other.status_code == 200 and again.status_code == 304
            assert again.content == b"" and again.headers["etag"] == first.headers["etag"] == other.headers["etag"]
            assert first.headers["cache-control"] == again.headers["cache-control"] == "public, max-age=60"
            led = await client.get("/products/2", headers={"If-None-Match": '"x"'})  # the leading request's own
            assert led.status_code == 200 and led.headers["etag"]
            assert shop.calls == ["1/1", "2/1"]

    asyncio.run(main())


def test_a_write_evicts_every_copy_of_its_path_before_its_response(redis_url: str) -> None:
    async def main() -> None:
        async with client_of(redis_url) as (shop, client):
            for page in (1, 2):
                assert (await client.get("/products/1", params={"page": page})).json()["name"] == "lamp"
            assert (await client.get("/products/2")).json()["name"] == "desk"
            assert (await client.put("/products/1", params={"name": "chair"})).json() == {"renamed": True}
            for page in (1, 2):
                assert (await client.get("/products/1", params={"page": page})).json()["name"] == "chair"
            assert (await client.get("/products/2")).json()["name"] == "desk"  # another path: kept
            assert shop.calls == ["1/1", "1/2", "2/1", "1/1", "1/2"]

    asyncio.run(main())


def test_a_head_request_is_answered_from_a_kept_get_and_leads_nothing(redis_url: str) -> None:
    async def main() -> None:
        async with client_of(redis_url) as (shop, client):
            cold = await client.head("/products/1")  # a miss: the endpoint runs for it, nothing is kept
            assert cold.status_code == 200 and shop.calls == ["1/1"]
            got = await client.get("/products/1")
            assert shop.calls == ["1/1", "1/1"]
            head = await client.head("/products/1")
            assert head.status_code == 200 and head.content == b"" and shop.calls == ["1/1", "1/1"]
            assert head.headers["etag"] == got.headers["etag"]
            assert head.headers["content-length"] == str(len(got.content))
            again = await client.head("/products/1", headers={"If-None-Match": got.headers["etag"]})
            assert again.status_code == 304 and shop.calls == ["1/1", "1/1"]

    asyncio.run(main())


def test_a_head_request_is_answered_by_its_endpoint_while_the_cache_is_away() -> None:
    async def main() -> None:
        with RedisServer() as server:
            async with client_of(server.url) as (shop, client):
                assert (await client.get("/products/1")).status_code == 200 and shop.calls == ["1/1"]
                server.stop()
                head = await client.head("/products/1")
                assert head.status_code == 200 and shop.calls == ["1/1", "1/1"]

    asyncio.run(main())


def test_an_app_under_a_root_path_evicts_its_own_paths(redis_url: str) -> None:
    async def main() -> None:
        async with client_of(redis_url, root_path="/api") as (shop, client):
            assert (await client.get("/products/1")).json()["name"] == "lamp"
            assert (await client.get("/products/1")).json()["name"] == "lamp" and shop.calls == ["1/1"]
            assert (await client.put("/products/1", params={"name": "chair"})).json() == {"renamed": True}
            assert (await client.get("/products/1")).json()["name"] == "chair" and shop.calls == ["1/1", "1/1"]

    asyncio.run(main())


def test_a_load_in_flight_at_an_eviction_is_not_kept(redis_url: str) -> None:
    """The stale-set guard: a GET that read the old name before a write evicted its path
    answers it, but nobody after is served it."""

    async def main() -> None:
        async with client_of(redis_url) as (shop, client):
            shop.gate = asyncio.Event()
            reading = asyncio.ensure_future(client.get("/products/1"))
            while not shop.calls:
                await asyncio.sleep(0.001)
            await client.put("/products/1", params={"name": "chair"})
            shop.gate.set()
            assert (await reading).json()["name"] == "lamp"
            assert (await client.get("/products/1")).json()["name"] == "chair"

    asyncio.run(main())


def test_what_is_never_shared(redis_url: str) -> None:
    """A request with Authorization or Cookie runs the endpoint itself (unless the cache
    varies on it); a response that is not a 200 or sets a cookie is kept for nobody,
    and the requests that waited for it run the endpoint themselves."""

    async def main() -> None:
        async with client_of(redis_url) as (shop, client):
            await client.get("/products/1")
            await client.get("/products/1", headers={"Authorization": "Bearer a"})
            await client.get("/products/1", headers={"Cookie": "session=b"})
            assert shop.calls == ["1/1", "1/1", "1/1"]
            shop.status, shop.gate = 503, asyncio.Event()
            waiting = [asyncio.ensure_future(client.get("/products/2")) for _ in range(3)]
            while not shop.calls[3:]:
                await asyncio.sleep(0.001)
            shop.gate.set()
            assert [(await each).status_code for each in waiting] == [503] * 3
            assert shop.calls[3:] == ["2/1"] * 3  # the leader's 503, then each waiter's own
        async with client_of(redis_url, vary=["authorization"]) as (shop, client):
            for token in ("a", "b", "a"):
                await client.get("/products/1", headers={"Authorization": f"Bearer {token}"})
            assert shop.calls == ["1/1", "1/1"]  # one per token

    asyncio.run(main())


def test_dependency_overrides_turn_a_routes_caching_off(redis_url: str) -> None:
    async def main() -> None:
        async with client_of(redis_url) as (shop, client):
            shop.app.dependency_overrides[shop.product_cache] = lambda: None
            await client.get("/products/1")
            await client.get("/products/1")
            assert shop.calls == ["1/1", "1/1"]
            shop.app.dependency_overrides.clear()
            await client.get("/products/1")
            await client.get("/products/1")
            assert shop.calls == ["1/1", "1/1", "1/1"]

    asyncio.run(main())


def test_bad_settings_are_refused(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="ttl"):
        cache(ttl=0)
    with pytest.raises(ConfigError, match="paths"):
        cache_evict()
    app = FastAPI()

    @app.get("/", dependencies=[Depends(cache(ttl=1))])
    async def page() -> str:
        return "page"

    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as client:
            with pytest.raises(ConfigError, match="caching\\(app, layer\\)"):
                await client.get("/")

    asyncio.run(main())


def test_the_host_and_the_headers_urls_are_built_from_are_in_the_key(redis_url: str) -> None:
    """A page built from the request's host (``url_for``), first asked for with ``Host:
    evil.example``, was served with that host's links to every later request: the key
    holds the scheme, the host and ``Forwarded``/``X-Forwarded-*``, as ``stampede.http``'s
    does."""

    async def main() -> None:
        async with client_of(redis_url) as (shop, client):

            @shop.app.get("/links/{product_id}", dependencies=[Depends(shop.product_cache)])
            async def links(product_id: int, request: Request) -> dict[str, str]:
                shop.calls.append(f"links/{product_id}")
                return {"self": str(request.url_for("product", product_id=product_id))}

            poisoned = await client.get("/links/1", headers={"Host": "evil.example"})
            assert poisoned.json()["self"] == "http://evil.example/products/1"
            assert (await client.get("/links/1")).json()["self"] == "http://shop/products/1"
            forwarded = await client.get("/links/1", headers={"X-Forwarded-Host": "evil.example"})
            assert forwarded.json()["self"] == "http://shop/products/1"  # its own entry (FastAPI does not read it)
            assert (await client.get("/links/1")).json()["self"] == "http://shop/products/1"
            assert shop.calls == ["links/1"] * 3  # three keys: evil.example, shop, shop behind a forwarder
        with pytest.raises(ConfigError, match="key_headers"):
            cache(ttl=1, key_headers="x-forwarded-host")

    asyncio.run(main())


def test_every_spelling_of_one_resource_is_one_entry_and_evicted_as_one(redis_url: str) -> None:
    """``/products/007`` is product 7 to the endpoint: it was cached apart from
    ``/products/7``, and a write to ``/products/7`` left it serving the old page."""

    async def main() -> None:
        async with client_of(redis_url) as (shop, client):
            shop.names[7] = "stool"
            assert (await client.get("/products/007")).json()["name"] == "stool"
            assert (await client.get("/products/7")).json()["name"] == "stool"
            assert (await client.get("/products/+7")).json()["name"] == "stool"
            assert shop.calls == ["7/1"]  # one entry
            assert (await client.put("/products/7", params={"name": "bench"})).json() == {"renamed": True}
            assert (await client.get("/products/007")).json()["name"] == "bench"
            assert (await client.put("/products/0007", params={"name": "seat"})).json() == {"renamed": True}
            assert (await client.get("/products/7")).json()["name"] == "seat"
            assert shop.calls == ["7/1"] * 3
            assert (await client.get("/products/seven")).status_code == 422  # not product 7, and not kept

    asyncio.run(main())


def test_a_weak_or_any_if_none_match_is_answered_304(redis_url: str) -> None:
    """RFC 9110 13.1.2: If-None-Match compares weakly, and ``*`` matches any current
    representation (both got a 200)."""

    async def main() -> None:
        async with client_of(redis_url) as (_, client):
            etag = (await client.get("/products/1")).headers["etag"]
            for header in (f"W/{etag}", "*", f'"other", W/{etag}', f" {etag} "):
                answer = await client.get("/products/1", headers={"If-None-Match": header})
                assert (answer.status_code, answer.content) == (304, b""), header
            assert (await client.get("/products/1", headers={"If-None-Match": 'W/"other"'})).status_code == 200

    asyncio.run(main())
