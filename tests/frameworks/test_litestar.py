"""``stampede.litestar``: ``StampedeStore`` keeps Litestar's ``Store`` protocol (values,
expiry, renewal, namespaces, ``delete_all``) with the layer's meanings (a ``set``
overtakes a load in flight, a ``delete`` is never undone by one), and ``StampedePlugin``'s
response cache runs a cached handler once for the concurrent misses of a URL (in 4
processes: test_asgi_collapse.py). Litestar's source distribution ships no tests of its
stores: these are ours."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
import redis

from stampede import ConfigError, Stampede

pytest.importorskip("litestar", reason="Litestar is not installed (the dev extra has it)")

import httpx
from litestar import Litestar, Request, Response, get
from litestar.config.response_cache import ResponseCacheConfig
from litestar.middleware.rate_limit import RateLimitConfig
from litestar.middleware.session.server_side import ServerSideSessionConfig
from litestar.params import FromPath
from litestar.stores.memory import MemoryStore
from litestar.stores.registry import StoreRegistry

from stampede.litestar import StampedePlugin, StampedeStore


def layer_at(redis_url: str, **settings: Any) -> Stampede:
    return Stampede.from_url(redis_url, namespace=f"ls-{uuid.uuid4().hex[:8]}", jitter=0, **settings)


@asynccontextmanager
async def store_at(redis_url: str) -> AsyncIterator[StampedeStore]:
    layer = layer_at(redis_url)
    try:
        yield StampedeStore(layer)
    finally:
        await layer.aclose()


async def until_gone(store: StampedeStore, key: str, within: float) -> float:
    """Seconds until ``key`` is gone from ``store`` (its server's TTL ended), at most ``within``."""
    began = time.monotonic()
    while await store.exists(key):
        assert time.monotonic() - began < within, f"{key!r} outlived {within} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - began


def test_values_expiry_and_renewal(redis_url: str) -> None:
    async def main() -> None:
        async with store_at(redis_url) as store:
            assert await store.get("absent") is None and not await store.exists("absent")
            assert await store.expires_in("absent") is None
            await store.set("text", "välue")
            await store.set("bytes", b"\x00\xff", expires_in=timedelta(seconds=30))
            assert await store.get("text") == "välue".encode() and await store.get("bytes") == b"\x00\xff"
            assert await store.expires_in("text") is None  # none was set
            assert 28 <= (await store.expires_in("bytes") or 0) <= 30
            await store.set("empty", b"")
            assert await store.get("empty") == b"" and await store.exists("empty")

            await store.set("short", b"s", expires_in=1)
            assert await store.get("short") == b"s"
            assert 0.5 < await until_gone(store, "short", within=3.0)  # the server's TTL ends it

            await store.set("renewed", b"r", expires_in=1)
            assert await store.get("renewed", renew_for=30) == b"r"
            assert 28 <= (await store.expires_in("renewed") or 0) <= 30
            await store.set("forever", b"f")
            assert await store.get("forever", renew_for=1) == b"f"  # no expiry was set: a no-op
            assert await store.expires_in("forever") is None
            assert await store.get("absent", renew_for=5) is None and not await store.exists("absent")

            await store.delete("text")
            await store.delete("never-there")  # a no-op
            assert await store.get("text") is None and await store.get("bytes") == b"\x00\xff"
            with pytest.raises(ValueError, match="expires_in"):
                await store.set("negative", b"x", expires_in=-1)

    asyncio.run(main())


def test_namespaces_are_apart_and_delete_all_empties_a_namespace_and_its_children(redis_url: str) -> None:
    async def main() -> None:
        async with store_at(redis_url) as root:
            sessions, limits = root.with_namespace("sessions"), root.with_namespace("limits")
            nested = sessions.with_namespace("admin")
            assert nested.namespace == "LITESTAR_sessions_admin"
            other = StampedeStore(root.layer, "OTHER")
            for store in (root, sessions, limits, nested, other):
                await store.set("k", store.namespace.encode())
            assert [await store.get("k") for store in (root, sessions, nested, other)] == [
                b"LITESTAR",
                b"LITESTAR_sessions",
                b"LITESTAR_sessions_admin",
                b"OTHER",
            ]
            await sessions.delete_all()
            assert await sessions.get("k") is None and await nested.get("k") is None
            assert await root.get("k") == b"LITESTAR" and await limits.get("k") == b"LITESTAR_limits"
            await root.delete_all()
            assert [await store.get("k") for store in (root, limits)] == [None, None]
            assert await other.get("k") == b"OTHER"  # another root namespace: kept

    asyncio.run(main())


def test_a_set_overtakes_a_load_in_flight_and_a_delete_is_never_undone_by_one(redis_url: str) -> None:
    """A request leading a response's load, whose handler read the database before a
    write deleted (or set) the key: its response is answered, but not kept."""

    async def main() -> None:
        async with served(redis_url) as (shop, client):
            assert (await client.get("/products/2")).json()["name"] == "desk"
            store = shop.app.stores.get("response_cache")
            assert isinstance(store, StampedeStore)
            desk = await store.get("GET/products/2")  # a kept response, as Litestar encodes it
            assert desk is not None
            for write in ("delete", "set"):
                shop.gate = asyncio.Event()
                shop.calls.clear()
                reading = asyncio.ensure_future(client.get("/products/1"))
                while not shop.calls:
                    await asyncio.sleep(0.001)
                shop.names[1] = f"chair after {write}"
                if write == "delete":
                    await store.delete("GET/products/1")
                else:
                    await store.set("GET/products/1", desk, expires_in=60)
                shop.gate.set()
                assert (await reading).json()["name"] == "lamp"  # what its handler read
                after = (await client.get("/products/1")).json()
                if write == "delete":  # nothing kept: the next request runs the handler
                    assert after["name"] == "chair after delete" and shop.calls == [1, 1]
                else:  # the set's value, not the load's
                    assert after["name"] == "desk" and shop.calls == [1]
                await store.delete("GET/products/1")
                shop.names[1] = "lamp"
                shop.gate = None

    asyncio.run(main())


class Shop:
    """An app over a layer with ``StampedePlugin``: a cached product handler that counts its
    calls, and what its tests change."""

    def __init__(self, layer: Stampede, **app: Any) -> None:
        self.calls: list[int] = []
        self.names = {1: "lamp", 2: "desk"}
        self.status = 200
        self.gate: asyncio.Event | None = None
        self.fail = False

        @get("/products/{product_id:int}", cache=60)
        async def product(product_id: FromPath[int]) -> Any:
            self.calls.append(product_id)
            name = self.names[product_id]
            if self.gate is not None:
                await self.gate.wait()
            if self.fail:
                raise RuntimeError("the database went away")
            return Response({"id": product_id, "name": name}, status_code=self.status)

        self.app = Litestar([product], plugins=[StampedePlugin(layer)], **app)


@asynccontextmanager
async def served(redis_url: str, **app: Any) -> AsyncIterator[tuple[Shop, httpx.AsyncClient]]:
    layer = layer_at(redis_url)
    shop = Shop(layer, **app)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=shop.app), base_url="http://shop") as client:
            yield shop, client
    finally:
        await layer.aclose()


def test_concurrent_misses_in_one_process_run_the_handler_once(redis_url: str) -> None:
    async def main() -> None:
        async with served(redis_url) as (shop, client):
            shop.gate = asyncio.Event()
            requests = [asyncio.ensure_future(client.get("/products/1")) for _ in range(16)]
            while not shop.calls:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.05)  # the others join the load meanwhile (more calls would fail below)
            shop.gate.set()
            responses = await asyncio.gather(*requests)
            assert {(r.status_code, r.text) for r in responses} == {(200, '{"id":1,"name":"lamp"}')}
            assert shop.calls == [1]
            assert (await client.get("/products/1")).json()["name"] == "lamp" and shop.calls == [1]
            assert (await client.get("/products/2")).json()["name"] == "desk" and shop.calls == [1, 2]

    asyncio.run(main())


def test_a_response_not_kept_is_handed_to_nobody(redis_url: str) -> None:
    """A 500 (or a handler that raised) is not kept by Litestar: the requests that waited
    on it run the handler themselves, and nothing is cached."""

    async def main() -> None:
        for failing in ("status", "raise"):
            async with served(redis_url) as (shop, client):
                shop.gate = asyncio.Event()
                if failing == "status":
                    shop.status = 500
                else:
                    shop.fail = True
                requests = [asyncio.ensure_future(client.get("/products/1")) for _ in range(4)]
                while not shop.calls:
                    await asyncio.sleep(0.001)
                await asyncio.sleep(0.05)
                shop.gate.set()
                responses = await asyncio.gather(*requests)
                assert [r.status_code for r in responses] == [500] * 4
                assert len(shop.calls) == 4  # each waiter ran it: the leader's was nobody's
                shop.status, shop.fail = 200, False
                assert (await client.get("/products/1")).status_code == 200
                assert len(shop.calls) == 5
                assert (await client.get("/products/1")).status_code == 200 and len(shop.calls) == 5

    asyncio.run(main())


def test_a_leading_request_that_goes_away_hands_over(redis_url: str) -> None:
    async def main() -> None:
        async with served(redis_url) as (shop, client):
            shop.gate = asyncio.Event()
            leader = asyncio.ensure_future(client.get("/products/1"))
            while not shop.calls:
                await asyncio.sleep(0.001)
            waiter = asyncio.ensure_future(client.get("/products/1"))
            await asyncio.sleep(0.05)
            leader.cancel()
            with pytest.raises(asyncio.CancelledError):
                await leader
            shop.gate.set()
            response = await asyncio.wait_for(waiter, 10)  # not the layer's wait_timeout: at once
            assert response.json()["name"] == "lamp" and shop.calls == [1, 1]

    asyncio.run(main())


def test_sessions_and_rate_limits_keep_their_data_on_the_layer(redis_url: str) -> None:
    @get("/visit", sync_to_thread=False)
    def visit(request: Request) -> dict[str, int]:
        visits = request.session.get("visits", 0) + 1
        request.set_session({"visits": visits})
        return {"visits": visits}

    async def main() -> None:
        layer = layer_at(redis_url)
        app = Litestar(
            [visit],
            plugins=[StampedePlugin(layer)],
            middleware=[ServerSideSessionConfig().middleware, RateLimitConfig(rate_limit=("minute", 3)).middleware],
        )
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as client:
                got = [(await client.get("/visit")) for _ in range(4)]
            assert [r.status_code for r in got] == [200, 200, 200, 429]
            assert [r.json()["visits"] for r in got[:3]] == [1, 2, 3]
            for name in ("sessions", "rate_limit"):
                store = app.stores.get(name)
                assert isinstance(store, StampedeStore) and store.namespace == f"LITESTAR_{name}"
            keys = [key.decode() for key in redis.Redis.from_url(redis_url).keys(f"{layer.namespace}:*")]
            assert any(key.startswith(f"{layer.namespace}:{{litestar:LITESTAR_sessions:") for key in keys), keys
        finally:
            await layer.aclose()

    asyncio.run(main())


def test_stores_the_app_names_are_kept_and_another_response_cache_store_collapses(redis_url: str) -> None:
    async def main() -> None:
        layer = layer_at(redis_url)
        own = MemoryStore()
        try:
            app = Litestar(
                [],
                plugins=[StampedePlugin(layer)],
                stores={"mine": own},
                response_cache_config=ResponseCacheConfig(store="pages"),
            )
            assert app.stores.get("mine") is own
            pages = app.stores.get("pages")
            assert isinstance(pages, StampedeStore) and pages._collapse
            other = app.stores.get("response_cache")
            assert isinstance(other, StampedeStore) and not other._collapse
        finally:
            await layer.aclose()

    asyncio.run(main())


def test_bad_settings_are_refused(redis_url: str) -> None:
    async def main() -> None:
        jittered = Stampede.from_url(redis_url, namespace="ls-jitter")
        with pytest.raises(ConfigError, match="jitter=0"):
            StampedeStore(jittered)
        await jittered.aclose()
        client = redis.Redis.from_url(redis_url)
        blocking = Stampede(client, namespace="ls-blocking", jitter=0)
        with pytest.raises(ConfigError, match="asyncio client"):
            StampedeStore(blocking)
        blocking.close()
        client.close()
        layer = layer_at(redis_url)
        for bad in ("", "with space", "a:b", "x" * 65, "{tag}"):
            with pytest.raises(ConfigError, match="namespace"):
                StampedeStore(layer, bad)
        with pytest.raises(ConfigError, match="registry"):
            Litestar([], plugins=[StampedePlugin(layer)], stores=StoreRegistry())
        await layer.aclose()

    asyncio.run(main())
