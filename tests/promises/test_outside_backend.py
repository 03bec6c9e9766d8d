"""A backend written outside the package, passed to ``Stampede(backend=...)``, runs the
shipped contract suite unchanged (``stampede.testing.contract``), as a third party's
would: nothing of stampede is edited, and only public names are used.

The backend here is one a team might write to meter its cache: every store command goes
through a store of its own, which counts it and hands it to one of the shipped stores
(the embedded one, or Redis over clients the test made), blocking and asyncio alike.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from stampede import ConfigError, Redlock, Stampede, backends
from stampede.testing.contract import *  # noqa: F403  (the contract's fixtures and tests)

pytestmark = pytest.mark.timeout(30)

COUNTS: collections.Counter[str] = collections.Counter()  # every command, by name, across the module's tests


class Metered:
    """A store of this test's own: counts each command, then forwards it to ``inner`` (a
    blocking store, or one event loop's: a forwarded coroutine is awaited by the caller)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        command = getattr(self._inner, name)
        if not callable(command):
            return command

        def metered(*args: Any, **kwargs: Any) -> Any:
            COUNTS[name] += 1
            return command(*args, **kwargs)

        return metered


def metered(builder: backends.BackendBuilder) -> backends.BackendBuilder:
    """A backend built by ``builder``, its stores behind ``Metered``."""

    def build(options: backends.BackendOptions) -> backends.Backend:
        inner = builder(options)
        make_async = inner.make_async_store
        return dataclasses.replace(
            inner,
            name=f"metered {inner.name}",
            store=Metered(inner.store),  # a Store by what it answers
            make_async_store=None if make_async is None else lambda: Metered(make_async()),
        )

    return build


@pytest.fixture(params=["memory", "redis"])
def contract_layer(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Callable[..., Stampede]]:
    made: list[Stampede] = []
    clients: list[redis.Redis] = []

    def make(**options: Any) -> Stampede:
        if request.param == "memory":
            shipped = backends.memory()
        else:
            client = redis.Redis.from_url(redis_url, socket_timeout=5)
            clients.append(client)
            shipped = backends.redis(client, lambda: redis.asyncio.Redis.from_url(redis_url, socket_timeout=5))
        layer = Stampede(backend=metered(shipped), **options)
        made.append(layer)
        return layer

    yield make
    for layer in made:
        layer.close()
    for client in clients:
        client.close()


def test_the_layer_runs_on_the_outside_backend_and_every_command_went_through_it(
    contract_layer: Callable[..., Stampede],
) -> None:
    layer = contract_layer(namespace="outside")
    before = COUNTS.copy()
    loads = []

    @layer.cached_loader("product:{product_id}")
    def product(product_id: int) -> dict[str, int]:
        loads.append(product_id)
        return {"id": product_id}

    assert [product(7), product(7)] == [{"id": 7}, {"id": 7}] and loads == [7]
    assert "metered" in repr(layer)
    assert COUNTS["get"] - before["get"] >= 2 and COUNTS["write_release"] - before["write_release"] == 1


def test_a_backend_refused_says_why() -> None:
    with pytest.raises(ConfigError, match="maker of a Backend"):
        Stampede(backend="redis://127.0.0.1:1")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not a stampede.backends.Backend"):
        Stampede(backend=lambda options: object())  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError, match="has no store"):
        Stampede(backend=lambda options: backends.Backend("empty", None, None))
    with pytest.raises(ConfigError, match="the whole backend"):
        Stampede(redis.Redis(), backend=backends.memory())
    with pytest.raises(ConfigError, match="needs a client"):
        backends.redis()


def test_a_scheme_registered_from_outside_is_opened_by_from_url() -> None:
    """``register_scheme``: ``Stampede.from_url`` opens the scheme with the opener given,
    within the bounds it was given, and closes what it opened with the layer."""
    opened: list[backends.Connections] = []
    closed: list[str] = []

    def open_metered(url: str, connections: backends.Connections) -> backends.Opened:
        opened.append(connections)
        return backends.Opened(metered(backends.memory()), lambda: closed.append(url))

    backends.register_scheme("metered-memory", open_metered)
    backends.register_scheme("METERED-memory", open_metered)  # the same opener again: nothing changes
    layer = Stampede.from_url("metered-memory://shop", namespace="registered", max_connections=7)
    try:
        load = layer.cached_loader("item:{n}")(lambda n: {"n": n})
        assert load(1) == load(1) == {"n": 1} and layer.stats()["loads"] == 1
        assert "metered memory" in repr(layer)
        assert [connections.max_connections for connections in opened] == [7] and closed == []
    finally:
        layer.close()
    assert closed == ["metered-memory://shop"]
    with pytest.raises(ConfigError, match="opened by"):
        backends.register_scheme("metered-memory", lambda url, connections: open_metered(url, connections))
    with pytest.raises(ConfigError, match="a URL scheme is"):
        backends.register_scheme("9p", open_metered)
    with pytest.raises(ConfigError, match="metered-memory://"):  # the schemes known are named
        Stampede.from_url("nobody-opens://x")


def test_a_lease_service_is_composed_into_a_new_backend_not_written_into_one(redis_url: str) -> None:
    """``redlock=`` beside a backend from outside: the layer's backend is a new one, with
    the service's policy and servers; the one the builder made is as it was. A family that
    takes no lease service is refused before anything connects."""
    built: list[backends.Backend] = []

    def keeping(builder: backends.BackendBuilder) -> backends.BackendBuilder:
        def build(options: backends.BackendOptions) -> backends.Backend:
            built.append(builder(options))
            return built[-1]

        return build

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    redlock = Redlock([redis_url])
    layer = Stampede(backend=keeping(metered(backends.redis(client))), redlock=redlock, namespace="composed")
    try:
        load = layer.cached_loader("item:{n}")(lambda n: {"n": n})
        assert load(1) == load(1) == {"n": 1} and layer.stats()["loads"] == 1
        assert "backend=metered redis+redlock" in repr(layer)
        (base,) = built
        assert base.name == "metered redis" and base.lock_servers is None and base.close_first == []
    finally:
        layer.close()
        client.close()
    with pytest.raises(ConfigError, match="beside a Redis cache server; the memory backend takes none"):
        Stampede(backend=backends.memory(), redlock=redlock)
    with pytest.raises(ConfigError, match="one at most"):
        Stampede(backend=backends.memory(), redlock=redlock, zookeeper="127.0.0.1:1")
    redlock.close()


class WithoutBudgets(Metered):
    """A store of one's own that implements no ``BudgetStore``, and so declares only hot
    sets among the optional roles (``stampede.backends.Roles``)."""

    optional_roles = backends.Roles.HOT_SETS

    def __getattr__(self, name: str) -> Any:
        if name in ("take_slot", "renew_slot", "release_slot"):
            raise AttributeError(name)
        return super().__getattr__(name)


def test_a_load_budget_on_a_store_without_budgets_is_refused_before_any_load() -> None:
    """At decoration where the layer has a blocking store (it answers for the asyncio one
    too); on an asyncio-only layer, whose store is made in its loop, at the first load,
    with the loader not called."""

    def build(asyncio_only: bool) -> backends.BackendBuilder:
        def make(options: backends.BackendOptions) -> backends.Backend:
            inner = backends.memory()(options)
            make_async = inner.make_async_store
            assert make_async is not None
            return dataclasses.replace(
                inner,
                name="budgetless",
                store=None if asyncio_only else WithoutBudgets(inner.store),
                make_async_store=lambda: WithoutBudgets(make_async()),
            )

        return make

    calls: list[int] = []

    def item(key: int) -> int:
        calls.append(key)
        return key

    async def aitem(key: int) -> int:
        calls.append(key)
        return key

    layer = Stampede(backend=build(asyncio_only=False))
    try:
        for func in (item, aitem):
            with pytest.raises(ConfigError, match="needs a store with load budgets; budgetless has none"):
                layer.cached_loader("item:{key}", max_concurrent_loads=2)(func)
    finally:
        layer.close()
    layer = Stampede(backend=build(asyncio_only=True))
    try:
        load = layer.cached_loader("item:{key}", max_concurrent_loads=2)(aitem)
        with pytest.raises(ConfigError, match="needs a store with load budgets; WithoutBudgets has none"):
            asyncio.run(load(1))
        assert calls == []
    finally:
        layer.close()
