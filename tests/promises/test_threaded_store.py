"""An outside backend written once: its blocking store serves ``async def`` loaders
through ``backends.ThreadedAsyncStore``. The store contract, asyncio side included, holds
over it on the embedded store and on a real Redis server, and so does the promise: one
load per key, no lease left behind by a cancelled caller."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from stampede import Stampede, backends
from stampede._core.keys import EntryKeys
from stampede.testing.contract import *  # noqa: F403  (the contract's fixtures and tests)

pytestmark = pytest.mark.timeout(30)


def threaded(inner: backends.BackendBuilder) -> backends.BackendBuilder:
    """``inner``'s backend with only its blocking store: the asyncio one is threads over it."""

    def make(options: backends.BackendOptions) -> backends.Backend:
        built = inner(options)
        store = built.store
        assert store is not None
        return dataclasses.replace(
            built, name=f"{built.name} threaded", make_async_store=lambda: backends.ThreadedAsyncStore(store)
        )

    return make


@pytest.fixture(params=["memory", "redis"])
def contract_layer(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Callable[..., Stampede]]:
    made: list[Stampede] = []
    clients: list[redis.Redis] = []

    def make(**options: Any) -> Stampede:
        if request.param == "memory":
            builder = threaded(backends.memory())
        else:
            clients.append(redis.Redis.from_url(redis_url, socket_timeout=5))
            builder = threaded(backends.redis(clients[-1]))
        made.append(Stampede(backend=builder, **options))
        return made[-1]

    yield make
    for layer in made:
        layer.close()
    for client in clients:
        client.close()


def test_the_threaded_store_declares_what_its_blocking_store_declares(contract_layer: Any) -> None:
    layer = contract_layer(namespace="threaded")

    async def roles() -> backends.Roles:
        return backends.roles_of(layer.loop_store())

    assert asyncio.run(roles()) == backends.roles_of(layer.store()) != backends.Roles.NONE


def test_concurrent_async_callers_of_a_cold_key_load_it_once(contract_layer: Any) -> None:
    layer = contract_layer(namespace="threaded")
    calls: list[int] = []
    release = asyncio.Event()

    @layer.cached_loader("item:{n}")
    async def item(n: int) -> dict[str, int]:
        calls.append(n)
        await release.wait()
        return {"n": n}

    async def storm() -> list[dict[str, int]]:
        tasks = [asyncio.create_task(item(1)) for _ in range(50)]
        while not calls:
            await asyncio.sleep(0.001)
        release.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(storm()) == [{"n": 1}] * 50
    assert calls == [1] and layer.stats()["loads"] == 1


def test_a_caller_cancelled_mid_command_leaves_no_lease(contract_layer: Any) -> None:
    """The cancelled acquire runs on in its thread: the cancellation waits for it, so the
    flow's release by token comes after it and no lease outlives the caller."""
    layer = contract_layer(namespace="threaded")
    inside, go_on = threading.Event(), threading.Event()
    store = layer.store()
    acquire = store.acquire

    def slow_acquire(*args: Any, **options: Any) -> Any:
        inside.set()
        go_on.wait(10)
        return acquire(*args, **options)

    @layer.cached_loader("item:{n}")
    async def item(n: int) -> int:
        return n

    async def cancelled() -> None:
        task = asyncio.create_task(item(7))
        await asyncio.to_thread(inside.wait, 10)
        task.cancel()
        await asyncio.sleep(0)
        go_on.set()  # the acquire takes the lease after its caller was cancelled
        with pytest.raises(asyncio.CancelledError):
            await task

    store.acquire = slow_acquire  # type: ignore[method-assign]
    try:
        asyncio.run(cancelled())
    finally:
        del store.acquire
    key = layer.cached_loader("item:{n}")(lambda n: n).key(7)
    assert store.holder(EntryKeys.for_value(key)) is None  # released by token after the acquire ended
