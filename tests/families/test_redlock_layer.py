"""A layer whose loads' leases are Redlock leases (``Stampede(client, redlock=...)``), over
five lock servers the suite starts: one load per key with lock servers down, the error
policy when a majority is down, invalidation, a cache server that loses its keys
mid-load, a killed holder process, and async loaders. The behaviour suite also runs
over a Redlock layer (the "redlock" backend of ``layer_of_each_backend``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from stampede import BackendUnavailable, ConfigError, Redlock, Stampede
from stampede._core.keys import EntryKeys
from stampede.testing import RedisServer

from ..promises.test_behaviour import CountingLoader, lock_is_held
from ..promises.test_freshness import stale_now
from ..promises.test_processes import Workers, run_stampede
from ..scenarios import wait_until

pytestmark = pytest.mark.extended  # Redlock: CI's extended step (tests/conftest.py)


def urls(servers: list[RedisServer]) -> list[str]:
    return [server.url for server in servers]


def test_sixteen_threads_in_two_layers_load_once_with_two_of_five_lock_servers_down(
    five: list[RedisServer], make_layer: Callable[..., Stampede]
) -> None:
    five[0].kill()
    five[1].kill()
    with Redlock(urls(five)) as redlock:
        db = CountingLoader(delay=0.2)
        layers = [make_layer(redlock=redlock), make_layer(redlock=redlock)]
        loads = [layer.cached_loader("item:{key}")(db) for layer in layers]
        barrier = threading.Barrier(16)

        def call(index: int) -> Any:
            barrier.wait()
            return loads[index % 2](1)

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(call, range(16)))
        assert results == [{"id": 1}] * 16
        assert db.calls == {1: 1}
        assert not any(lock_is_held(layer, loads[0].key(1)) for layer in layers)


def test_four_processes_of_eight_threads_load_once_over_redlock_leases(
    five: list[RedisServer], redis_url: str, redis_client: redis.Redis
) -> None:
    lock_servers = [arg for url in urls(five) for arg in ("--redlock", url)]
    results = run_stampede(redis_url, 4, "--threads", "8", "--delay", "0.2", *lock_servers)
    assert int(redis_client.get("calls:0") or 0) == 1
    assert sum(result["calls"] for result in results) == 32
    assert all(result["wrong"] == [] for result in results)


@pytest.mark.parametrize("policy", ["raise", "load"])
def test_three_of_five_lock_servers_down_is_a_backend_failure(
    policy: str, five: list[RedisServer], make_layer: Callable[..., Stampede]
) -> None:
    """No lease is possible: the layer's ``on_backend_error`` decides, as for a cache server
    that is down. "raise" names the key and how many servers answered; "load" loads
    without caching. Grants by the two live servers are undone."""
    for server in five[:3]:
        server.kill()
    with Redlock(urls(five)) as redlock:
        db = CountingLoader()
        layer = make_layer(redlock=redlock, on_backend_error=policy)
        load = layer.cached_loader("item:{key}")(db)
        started = time.monotonic()
        if policy == "raise":
            with pytest.raises(BackendUnavailable, match=r"only 2 of 5 lock servers answered for 'test:\{item:1\}'"):
                load(1)
            assert db.calls == {}
        else:
            assert load(1) == load(1) == {"id": 1}
            assert db.calls == {1: 2}  # nothing cached without a lease
        assert time.monotonic() - started < 1.0
        assert not lock_is_held(layer, load.key(1))


def test_an_invalidation_mid_load_refuses_the_write_and_a_waiter_takes_over_at_once(
    five: list[RedisServer], make_layer: Callable[..., Stampede]
) -> None:
    """Layer A loads version 1; layer B waits on A's lease. The data changes and A's entry
    is invalidated: the lease is dropped on the lock servers and the cache server, so B
    takes it and loads version 2 while A's load still runs. A's late write is refused."""
    version = {"now": 1}
    with Redlock(urls(five)) as redlock:
        first, second = make_layer(redlock=redlock), make_layer(redlock=redlock)
        slow = CountingLoader(lambda key: {"v": version["now"]})
        slow.release.clear()
        fast = CountingLoader(lambda key: {"v": version["now"]})
        load_first = first.cached_loader("item:{key}")(slow)
        load_second = second.cached_loader("item:{key}")(fast)
        with ThreadPoolExecutor(2) as pool:
            first_call = pool.submit(load_first, 1)
            assert slow.started.wait(5)
            second_call = pool.submit(load_second, 1)
            wait_until(lambda: second.stats()["lock_waits"] == 1, "the second layer to wait")
            version["now"] = 2
            load_first.invalidate(1)
            assert second_call.result(timeout=5) == {"v": 2}  # while the first load still runs
            assert not first_call.done()
            slow.release.set()
            assert first_call.result(timeout=5) == {"v": 1}  # its call began before the change
        assert first.stats()["stale_writes_prevented"] == 1
        assert load_second(1) == load_first(1) == {"v": 2}
        assert slow.calls == fast.calls == {1: 1}
        assert not lock_is_held(first, load_first.key(1))


@pytest.mark.parametrize("leases", ["cache server only", "redlock"])
@pytest.mark.timing
def test_a_cache_server_restarted_empty_mid_load(
    leases: str, own_server: RedisServer, five: list[RedisServer], make_layer: Callable[..., Stampede]
) -> None:
    """The cache server is killed and restarted empty while layer A loads; then layer B is
    called. With the lease on the cache server only, it went with the restart: B loads
    at once, beside A. With Redlock leases, A's lease lives on: B waits through three
    lease lengths while A loads, and loads only after A has finished (A's own write is
    refused, since the restart may have lost an invalidation)."""
    redlock = Redlock(urls(five)) if leases == "redlock" else None
    inside = {"now": 0, "most": 0}
    guard = threading.Lock()

    def counted(key: int) -> dict[str, int]:
        with guard:
            inside["now"] += 1
            inside["most"] = max(inside["most"], inside["now"])
        return {"id": key}

    def left(loader: CountingLoader) -> Callable[[Any], Any]:
        def done(key: Any) -> Any:
            try:
                return loader(key)
            finally:
                with guard:
                    inside["now"] -= 1

        return done

    try:
        options: dict[str, Any] = dict(redlock=redlock, lock_ttl=0.3, recheck_interval=0.1)
        slow, fast = CountingLoader(counted), CountingLoader(counted)
        slow.release.clear()
        load_first = make_layer(own_server.url, **options).cached_loader("item:{key}")(left(slow))
        with ThreadPoolExecutor(1) as pool:
            first_call = pool.submit(load_first, 1)
            assert slow.started.wait(5)
            own_server.kill()
            own_server.start()
            load_second = make_layer(own_server.url, **options).cached_loader("item:{key}")(left(fast))
            second_call = threading.Thread(target=load_second, args=(1,))
            second_call.start()
            if redlock is None:
                assert fast.started.wait(5)  # at once: a second load beside the first
            else:
                assert not fast.started.wait(1.0)  # three lease lengths: A's renewals keep it out
            slow.release.set()
            assert first_call.result(timeout=5) == {"id": 1}
            second_call.join(5)
        assert fast.calls == {1: 1}
        assert inside["most"] == (2 if redlock is None else 1)
    finally:
        if redlock is not None:
            redlock.close()


def test_a_killed_holder_process_is_taken_over_after_its_lease(
    five: list[RedisServer], redis_url: str, redis_client: redis.Redis
) -> None:
    """A holder process is SIGKILLed mid-load: its lease on the lock servers (and the
    cache server) runs out, and a waiting process takes over within about a lease."""
    lock_servers = [arg for url in urls(five) for arg in ("--redlock", url)]
    # Half a second, not the default 50 ms, for the lock servers to answer: on a loaded
    # machine a release that cannot reach a server in time leaves its key there to lapse
    # by its term (best effort, as designed), and the last assertion would see it. This
    # test is about the takeover, not about slow lock servers.
    options = ["--lock-ttl", "1", "--wait-timeout", "10", "--redlock-timeout", "0.5", *lock_servers]
    workers = Workers()
    try:
        holder = workers.start(redis_url, "--threads", "1", "--hang", *options)
        workers.expect(holder, "ready")
        workers.go([holder])
        workers.expect(holder, "loading")
        waiter = workers.start(redis_url, "--threads", "4", *options)
        workers.expect(waiter, "ready")
        workers.go([waiter])
        wait_until(lambda: redis_client.pubsub_numsub("proc:{item:0}:notify")[0][1] >= 1, "the waiter", timeout=10)
        holder.kill()
        killed_at = time.monotonic()
        result = workers.result(waiter, timeout=15)
        finished = time.monotonic() - killed_at
    finally:
        workers.stop_all()
    assert result["wrong"] == [] and result["calls"] == 4
    assert int(redis_client.get("calls:0") or 0) == 2  # the killed holder's, and the takeover
    assert finished < 3  # a 1 s lease, then the waiter's re-check
    majority_key = "proc:{item:0}:lock:majority"
    left = {}  # each lock server still holding the lease: its token and time left
    for url in urls(five):
        with redis.Redis.from_url(url) as client:
            if client.exists(majority_key):
                left[url] = (client.get(majority_key), client.pttl(majority_key))
    assert not left, left


def test_fifty_coroutines_load_once_with_two_lock_servers_down(
    five: list[RedisServer], redis_url: str, redis_client: redis.Redis
) -> None:
    five[3].kill()
    five[4].kill()
    calls = {"n": 0}

    async def main() -> None:
        async with Redlock(urls(five)) as redlock:
            async with Stampede.from_url(redis_url, namespace="test", redlock=redlock) as layer:

                @layer.cached_loader("item:{key}")
                async def load(key: int) -> dict[str, int]:
                    calls["n"] += 1
                    await asyncio.sleep(0.2)
                    return {"id": key}

                results = await asyncio.gather(*(load(1) for _ in range(50)))
                assert results == [{"id": 1}] * 50
                await load.invalidate(1)
                assert await load(1) == {"id": 1}

    asyncio.run(main())
    assert calls["n"] == 2  # the stampede's load, and the one after the invalidation
    assert not redis_client.exists("test:{item:1}:lock")
    live = [redis.Redis.from_url(url) for url in urls(five)[:3]]
    assert all(client.exists("test:{item:1}:lock:majority") == 0 for client in live)


def test_a_redlock_layer_needs_a_cache_server_and_urls_for_async_loaders(
    five: list[RedisServer], redis_url: str
) -> None:
    with Redlock(urls(five)) as redlock:
        with pytest.raises(ConfigError, match="needs a cache server"):
            Stampede(redlock=redlock)
    clients = [redis.Redis.from_url(url) for url in urls(five)]

    async def main() -> None:
        with Redlock(clients) as redlock:
            async with Stampede.from_url(redis_url, namespace="test", redlock=redlock) as layer:

                @layer.cached_loader("item:{key}")
                async def load(key: int) -> int:
                    return key  # pragma: no cover - never called

                with pytest.raises(ConfigError, match="as URLs"):
                    await load(1)

    asyncio.run(main())


def test_a_caller_the_majority_refuses_serves_its_stale_value_once_the_loader_is_marked_failing(
    five: list[RedisServer], make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    """A failed load's hold lives on the cache server, which a caller the lock servers
    refuse does not reach. While a background refresh holds the majority a moment (to
    find that hold, and say nothing), a waiter re-checking is refused: the failing mark,
    read with the value, tells it to serve its stale value now, not to wait for a message
    nobody sends (its re-check is 10 s away here; CI saw a second layer serve nothing
    through a whole outage this way)."""
    with Redlock(urls(five)) as redlock:
        db = CountingLoader()
        settings = dict(jitter=0, recheck_interval=10.0, redlock=redlock)
        waiter = make_layer(**settings)
        load = waiter.cached_loader("item:{key}", ttl=0.2, stale_if_error=30)(db)
        assert load(1) == {"id": 1}
        keys = EntryKeys.for_value(load.key(1))
        stale_now(waiter, load.key(1), 30)
        for server in five:  # the majority, held by another caller's lease (a refresh's)
            redis.Redis.from_url(server.url).set(keys.on_lock_servers.lock, "another", px=30_000)
        with ThreadPoolExecutor(1) as pool:
            fetched = pool.submit(load.fetch, 1)
            wait_until(lambda: redis_client.pubsub_numsub(keys.channel)[0][1] == 1, "the caller to wait")
            # What a failed load leaves on the cache server: its hold, the failing mark,
            # and the message that wakes the waiters.
            redis_client.set(keys.lock, "!failed", px=5_000)
            redis_client.set(keys.failing, "1", px=30_000)
            redis_client.publish(keys.channel, "")
            woken = time.monotonic()
            served = fetched.result(10)
        assert served.value == {"id": 1} and served.stale
        assert time.monotonic() - woken < 2.0  # by the message, not the 10 s re-check
        assert waiter.stats()["stale_on_error"] == 1 and db.calls == {1: 1}
