"""Sentinel: clients through Sentinel, the redis+sentinel:// URL, and stampedes during a
failover (SENTINEL FAILOVER, and a master frozen by SIGSTOP).

The behaviour suite runs over the session's Sentinel set too (``layer_of_each_backend``);
tests that fail the master over start a set of their own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.sentinel
import redis.sentinel

from stampede import BackendUnavailable, ConfigError, Stampede
from stampede._core.keys import EntryKeys
from stampede.testing import RedisServer, SentinelServers, free_port

from ..families.test_cluster import (
    async_waiters_through,
    sixteen_threads_and_fifty_tasks_load_once,
    start_stampede,
    until,
)
from ..families.test_near_cache import copied, held, tracked, versioned
from ..modes import hammer
from ..promises.test_behaviour import CountingLoader

pytestmark = pytest.mark.extended  # the Sentinel family: CI's extended step (tests/conftest.py)


def subscribers(server: RedisServer, channel: str) -> int:
    with redis.Redis.from_url(server.url, socket_timeout=2) as client:
        return int(client.pubsub_numsub(channel)[0][1])


@pytest.fixture
def own_sentinels() -> Iterator[SentinelServers]:
    with SentinelServers() as sentinels:
        yield sentinels


def test_clients_made_through_sentinel_work_blocking_and_async(sentinel_servers: SentinelServers) -> None:
    redis.Redis.from_url(sentinel_servers.current_master().url).flushall()
    timeouts = {"socket_timeout": 2.0, "socket_connect_timeout": 1.0}
    sentinel = redis.sentinel.Sentinel(sentinel_servers.addresses, sentinel_kwargs=timeouts, **timeouts)
    client = sentinel.master_for(sentinel_servers.service)
    async_sentinels: list[Any] = []

    def make_async_client() -> redis.asyncio.Redis:
        manager = redis.asyncio.sentinel.Sentinel(sentinel_servers.addresses, sentinel_kwargs=timeouts, **timeouts)
        async_sentinels.append(manager)
        return manager.master_for(sentinel_servers.service)  # type: ignore[no-any-return]

    layer = Stampede(client, async_client=make_async_client, namespace="test")

    async def close_async_sentinels() -> None:
        for manager in async_sentinels:
            for one in manager.sentinels:
                await one.aclose()

    try:
        sixteen_threads_and_fifty_tasks_load_once(layer, after=close_async_sentinels)
    finally:
        layer.close()
        client.close()
        for one in sentinel.sentinels:
            one.close()


def test_a_service_no_sentinel_knows_is_a_config_error(sentinel_servers: SentinelServers) -> None:
    url = sentinel_servers.url.rsplit("/", 1)[0] + "/no-such-master"
    with pytest.raises(ConfigError, match="no sentinel at .* knows a master named 'no-such-master'"):
        Stampede.from_url(url, namespace="test")


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel:///service",
        "redis+sentinel://127.0.0.1:26379",
        "redis+sentinel://127.0.0.1:26379/service/db",
        "redis+sentinel://127.0.0.1:port/service",
        "redis+sentinel://127.0.0.1:26379/a/1/extra",
    ],
)
def test_a_malformed_sentinel_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError):
        Stampede.from_url(url)


def test_sentinels_nobody_answers_leave_the_layer_to_find_the_master_later() -> None:
    layer = Stampede.from_url(f"redis+sentinel://127.0.0.1:{free_port()}/service", socket_connect_timeout=0.2)
    try:
        calls = []

        @layer.cached_loader("item:{key}")
        def load(key: int) -> int:
            calls.append(key)
            return key

        assert load(1) == 1  # on_backend_error="load": served without the cache
        assert calls == [1]
    finally:
        layer.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["sentinel-failover", "sigstop"])
def test_a_failover_during_a_stampede_serves_every_caller_and_the_subscriber_follows(
    own_sentinels: SentinelServers, how: str
) -> None:
    settings = dict(namespace="test", lock_ttl=2.0, wait_timeout=10.0, recheck_interval=30.0, breaker_threshold=0)
    layers = [Stampede.from_url(own_sentinels.url, **settings) for _ in range(2)]
    old = own_sentinels.current_master()
    try:
        db = CountingLoader()
        db.release.clear()
        threads, outcomes = start_stampede(layers, [db] * len(layers), 8)
        assert db.started.wait(10)
        until(lambda: sum(layer.stats()["lock_waits"] for layer in layers) >= 1)  # one layer waits on the other
        channel = EntryKeys.for_value(layers[0].cached_loader("item:{key}")(db).key(1)).channel
        until(lambda: subscribers(old, channel) == 1)
        started = time.monotonic()
        if how == "sigstop":
            old.pause()
        else:
            own_sentinels.failover()
        new = own_sentinels.wait_master_moved(old)
        switched = time.monotonic()
        # The waiting layer's subscriber moves to the new master within a second of the
        # switch (it asks the sentinels every 0.5 s while waiters wait, then reconnects).
        followed = until(lambda: subscribers(new, channel) == 1, timeout=10)
        assert followed - switched < 1.0
        db.release.set()
        for thread in threads:
            thread.join(40)
        assert not any(thread.is_alive() for thread in threads)
        values = [outcome for outcome, _ in outcomes]
        assert values == [{"id": 1}] * 16  # every caller got the value (on_backend_error="load")
        longest = max(duration for _, duration in outcomes)
        assert longest < (switched - started) + settings["wait_timeout"] + 2 * 2.0 + 3.0
        # The holder's load, one takeover after its lease ran out on the new master, and
        # at most one uncached load per process whose command met the old master.
        assert db.total <= 2 + len(layers)
        # Caching resumes on the new master.
        if how == "sigstop":
            old.resume()
        loaders = [layer.cached_loader("item:{key}")(db) for layer in layers]
        for load in loaders:
            load(1)
        settled = db.total
        assert [load(1) for load in loaders * 2] == [{"id": 1}] * 4
        assert db.total == settled
    finally:
        if how == "sigstop":
            old.resume()
        for layer in layers:
            layer.close()


@pytest.mark.timeout(90)
def test_async_waiters_follow_the_master_across_a_sentinel_failover(own_sentinels: SentinelServers) -> None:
    settings = dict(namespace="test", lock_ttl=2.0, wait_timeout=10.0, recheck_interval=30.0, breaker_threshold=0)
    layers = (Stampede.from_url(own_sentinels.url, **settings), Stampede.from_url(own_sentinels.url, **settings))
    old = own_sentinels.current_master()

    def fail_over(channel: str) -> float:
        until(lambda: subscribers(old, channel) == 1)
        own_sentinels.failover()
        new = own_sentinels.wait_master_moved(old)
        switched = time.monotonic()
        return until(lambda: subscribers(new, channel) == 1) - switched

    held, waited, follow, _, db = async_waiters_through(layers, fail_over)
    assert held == {"id": 1} and waited == [{"id": 1}] * 20
    assert follow < 1.0  # the asyncio subscriber moved to the new master
    assert db.total <= 2 + 2  # the holder's, a takeover, one uncached per process at most


@pytest.mark.timeout(60)
def test_an_open_circuit_does_not_outlast_a_failover(own_sentinels: SentinelServers) -> None:
    layer = Stampede.from_url(own_sentinels.url, namespace="test", socket_timeout=0.5, breaker_threshold=2,
                              breaker_cooldown=30.0, on_backend_error="raise")  # fmt: skip
    old = own_sentinels.current_master()
    try:
        db = CountingLoader()
        load = layer.cached_loader("item:{key}")(db)
        assert load(1) == {"id": 1}
        old.pause()
        for _ in range(2):
            with pytest.raises(BackendUnavailable):
                load(1)
        with pytest.raises(BackendUnavailable, match="circuit open"):
            load(1)
        own_sentinels.wait_master_moved(old)
        until(lambda: load(1) == {"id": 1}, timeout=5.0)  # served again within seconds, not after 30 s
    finally:
        old.resume()
        layer.close()


def test_callers_beyond_max_connections_wait_for_a_connection_through_sentinel(
    make_sentinel_layer: Callable[..., Stampede],
) -> None:
    layer = make_sentinel_layer(max_connections=4)
    db = CountingLoader(delay=0.01)
    load = layer.cached_loader("item:{key}")(db)
    # More callers at once than redis-py's Sentinel pool allows by default (100), too.
    assert hammer(load, list(range(150))) == [{"id": key} for key in range(150)]
    assert db.calls == {key: 1 for key in range(150)}  # no caller was served without the cache
    assert layer.stats()["redis_errors"] == 0


@pytest.mark.timeout(90)
def test_a_near_cache_follows_the_master_and_drops_its_copies_on_a_switch(own_sentinels: SentinelServers) -> None:
    versions = {1: 1}
    holder = Stampede.from_url(own_sentinels.url, namespace="test", near_cache=True)
    writer = Stampede.from_url(own_sentinels.url, namespace="test", breaker_threshold=0)
    old = own_sentinels.current_master()
    try:
        load, write = versioned(holder, versions), versioned(writer, versions)
        tracked(holder)
        copied(holder, load, 1)
        flushes = holder.stats()["near_flushes"]
        own_sentinels.failover()
        new = own_sentinels.wait_master_moved(old)
        # The tracker moved to the new master. Its copies went when the old stream ended
        # (revoked: nothing served until a new lease), and the counted flush follows the
        # confirmation of the subscription there, a moment after the server counts it.
        until(lambda: subscribers(new, "test:near") == 1 and holder.stats()["near_flushes"] > flushes)
        assert not held(holder, load.key(1))
        tracked(holder)
        copied(holder, load, 1)  # a copy of the new master's value
        versions[1] = 2
        until(lambda: write.invalidate(1) is None)  # the writer may meet the old master first
        assert load(1)["version"] == 2
    finally:
        holder.close()
        writer.close()


def frozen_and_replaced(sentinels: SentinelServers, pool: Any, warm: Callable[[], Any]) -> float:
    """``warm()`` fills the pool with connections to the master; then the master is frozen
    (SIGSTOP) and the sentinels promote its replica. Returns once the pool knows the new
    master (the layer's watch of ``+switch-master`` told it), or 5 s after the switch."""
    warm()
    old = sentinels.current_master()
    old.pause()  # the test resumes it
    new = sentinels.wait_master_moved(old)
    deadline = time.monotonic() + 5.0  # (without the watch, the pool learns of it only from a failure)
    while tuple(pool.master_address or ()) != ("127.0.0.1", new.port) and time.monotonic() < deadline:
        time.sleep(0.01)
    return time.monotonic()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("made", ["url", "master_for"])
def test_no_call_after_a_frozen_master_is_replaced_waits_on_it(own_sentinels: SentinelServers, made: str) -> None:
    """Pooled connections to a frozen master are dropped at the switch: without that each
    waits out its socket timeout (3 s here), fails open and loads without the cache."""
    settings: dict[str, Any] = dict(namespace="test", breaker_threshold=0, on_backend_error="raise")
    timeouts = {"socket_timeout": 3.0, "socket_connect_timeout": 1.0}
    manager = redis.sentinel.Sentinel(own_sentinels.addresses, sentinel_kwargs=timeouts, **timeouts)
    if made == "url":
        layer = Stampede.from_url(own_sentinels.url, socket_timeout=3.0, **settings)
        pool = layer._runner.store.client.connection_pool  # type: ignore[union-attr]
    else:
        client = manager.master_for(own_sentinels.service)
        layer, pool = Stampede(client, **settings), client.connection_pool
    old = own_sentinels.current_master()
    try:
        db = CountingLoader()
        load = layer.cached_loader("item:{key}")(db)
        switched = frozen_and_replaced(own_sentinels, pool, lambda: hammer(load, list(range(8))))
        durations = hammer(lambda key: timed(load, key), list(range(100, 108)))
        assert [value for value, _ in durations] == [{"id": key} for key in range(100, 108)]
        assert max(seconds for _, seconds in durations) < 1.0, durations  # none waited on the old master
        assert db.calls == {**dict.fromkeys(range(8), 1), **dict.fromkeys(range(100, 108), 1)}
        assert [load(key) for key in range(100, 108)] == [{"id": key} for key in range(100, 108)]  # cached
        assert time.monotonic() - switched < 3.0
    finally:
        old.resume()
        layer.close()
        for one in manager.sentinels:
            one.close()
    assert not [thread for thread in threading.enumerate() if thread.name == "stampede-sentinel-switches"]


@pytest.mark.timeout(90)
def test_no_async_call_after_a_frozen_master_is_replaced_waits_on_it(own_sentinels: SentinelServers) -> None:
    layer = Stampede.from_url(own_sentinels.url, socket_timeout=3.0, namespace="test", on_backend_error="raise")
    db = CountingLoader()
    old = own_sentinels.current_master()

    @layer.cached_loader("item:{key}")
    async def load(key: int) -> Any:
        return db(key)

    async def main() -> list[tuple[Any, float]]:
        await asyncio.gather(*(load(key) for key in range(8)))  # connections to the old master
        store: Any = layer._async_runner.loop_store()  # type: ignore[union-attr]
        await asyncio.to_thread(frozen_and_replaced, own_sentinels, store.client.connection_pool, lambda: None)
        try:
            return await asyncio.gather(*(atimed(load, key) for key in range(100, 108)))
        finally:
            await layer.aclose()

    try:
        durations = asyncio.run(main())
        assert [value for value, _ in durations] == [{"id": key} for key in range(100, 108)]
        assert max(seconds for _, seconds in durations) < 1.0, durations
        assert db.calls == {**dict.fromkeys(range(8), 1), **dict.fromkeys(range(100, 108), 1)}
    finally:
        old.resume()
        layer.close()


def timed(call: Callable[[Any], Any], key: Any) -> tuple[Any, float]:
    started = time.monotonic()
    return call(key), time.monotonic() - started


async def atimed(call: Callable[[Any], Any], key: Any) -> tuple[Any, float]:
    started = time.monotonic()
    return await call(key), time.monotonic() - started


def test_a_task_cancelled_while_its_subscription_asks_the_sentinels_is_cancelled(
    sentinel_servers: SentinelServers,
) -> None:
    """A task's subscription asks the sentinels where the master is (now and then). A
    cancellation there must end the task: redis-py's lookup, its read from one sentinel
    cut, asks the next one and returns normally, and a waiter whose cancellation was
    lost so went on waiting for a lock it had given up (seen under CI load)."""
    from stampede._backends.redis.notify_async import AsyncSubscriber

    async def main() -> None:
        manager = redis.asyncio.sentinel.Sentinel(sentinel_servers.addresses, socket_timeout=2.0)
        pool = manager.master_for(sentinel_servers.service).connection_pool
        lookup = pool.get_master_address
        asked = asyncio.Event()

        async def lookup_that_keeps_going() -> Any:
            asked.set()
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                pass  # as redis-py does when a sentinel's read is cut: the next one is asked
            return await lookup()

        subscriber = AsyncSubscriber(pool, timeout=2.0)
        (await subscriber.subscribe("first")).close()  # connected: the next join follows the master
        subscriber._followed_at = 0.0
        pool.get_master_address = lookup_that_keeps_going
        joining = asyncio.ensure_future(subscriber.subscribe("second"))
        await asyncio.wait_for(asked.wait(), 5)
        joining.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(joining, 5)
        pool.get_master_address = lookup
        assert not subscriber._channels, "the cancelled subscription was left behind"
        await subscriber.aclose()
        for one in manager.sentinels:
            await one.aclose()
        await pool.disconnect()

    asyncio.run(main())


def test_closing_a_layer_ends_its_sentinel_watch(sentinel_servers: SentinelServers) -> None:
    """The layer's watch of ``+switch-master`` leaves the sentinels when it closes, and its
    thread ends. (Its close no longer waits for a read of a second to end: its connection
    has no retry of redis-py's own, which read on after close() shut its socket; a bound
    of that duration would not survive a stalled machine, so none is asserted.)"""

    def watching() -> int:
        subscribed = 0
        for sentinel in sentinel_servers.sentinels:
            with redis.Redis.from_url(sentinel.url, socket_timeout=2) as client:
                subscribed += sum(1 for found in client.client_list() if found.get("sub") == "1")
        return subscribed

    assert watching() == 0  # the layers of the tests before this one are closed
    layer = Stampede.from_url(sentinel_servers.url, namespace="closing")
    until(lambda: watching() == 1)
    layer.close()
    assert watching() == 0
    assert not [thread for thread in threading.enumerate() if thread.name == "stampede-sentinel-switches"]
