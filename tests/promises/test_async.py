"""What only ``async def`` loaders do, over real servers: cancellation, event loops in
threads, blocking and async callers of one key, an async client given or made per loop.
The promises both kinds of loader keep are written once, in test_behaviour.py (``mode``).

Each test runs its own event loop(s) with asyncio.run: no plugin is needed.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
import redis.asyncio

from stampede import BackendUnavailable, InvalidKey, Stampede, WaitTimeout
from stampede.testing import CommandMonitor, FaultProxy, RedisServer, names

from ..promises.test_processes import Workers
from ..scenarios import commands_run, until


class AsyncDatabase:
    """A fake database for async loaders: counts calls per key; can block until released.
    Made inside the loop that uses it (its events belong to that loop)."""

    def __init__(self, delay: float = 0.0, blocked: bool = False) -> None:
        self.delay = delay
        self.calls: dict[Any, int] = {}
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        if not blocked:
            self.release.set()

    async def __call__(self, key: Any) -> Any:
        self.calls[key] = self.calls.get(key, 0) + 1
        self.started.set()
        await asyncio.wait_for(self.release.wait(), 30)
        if self.delay:
            await asyncio.sleep(self.delay)
        return {"id": key}

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def test_a_cancelled_leader_hands_over_and_releases_the_lock(
    layer_of_each_backend: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = layer_of_each_backend(lock_ttl=10)

    async def main() -> float:
        db = AsyncDatabase(blocked=True)
        load = layer.cached_loader("item:{key}")(db)
        leader = asyncio.ensure_future(load(1))
        others = [asyncio.ensure_future(load(1)) for _ in range(20)]  # they join the leader's flight
        await asyncio.wait_for(db.started.wait(), 5)
        assert db.total == 1
        leader.cancel()
        cancelled_at = time.monotonic()
        db.release.set()  # the next leader's load returns at once
        results = await asyncio.gather(*others)
        assert results == [{"id": 1}] * 20
        with pytest.raises(asyncio.CancelledError):
            await leader
        assert db.total == 2  # the cancelled load and one more, not one per waiter
        return time.monotonic() - cancelled_at

    handed_over_in = asyncio.run(main())
    assert handed_over_in < 5  # well under lock_ttl: the lock was released, not left to expire
    assert redis_client.keys("test:*:lock") == []


def test_closing_waits_for_a_cancelled_callers_write_under_way(
    make_layer: Callable[..., Stampede], own_server: RedisServer
) -> None:
    """A caller cancelled during its write leaves the write running (it is shielded):
    ``aclose()`` lets it end before closing the connections, so the value is written, the
    lease released and no task of the loop is left pending (destroyed with the loop, it
    was cut mid-command and its lease left to lapse).

    On a server of its own, where no script is loaded yet: the write's first attempt is
    refused (NOSCRIPT) and sent again. The caller's release, on being cancelled, waits
    for the write to end; sent beside it, it overtook the retry and the write, finding
    the lease gone, kept nothing. (And the one blocked client the server counts is the
    write: no other test left a client there.)"""
    redis_client = redis.Redis.from_url(own_server.url, socket_timeout=5)
    layer = make_layer(own_server.url, lock_ttl=30, near_cache=False, socket_timeout=5)
    assert redis_client.info("clients")["blocked_clients"] == 0

    async def main() -> None:
        db = AsyncDatabase(blocked=True)
        load = layer.cached_loader("item:{key}")(db)
        caller = asyncio.ensure_future(load(1))
        await asyncio.wait_for(db.started.wait(), 5)
        redis_client.client_pause(10_000, all=False)  # writes wait: the load's write stays under way
        try:
            db.release.set()
            await until(lambda: redis_client.info("clients")["blocked_clients"] == 1, "the write under way")
            caller.cancel()  # it releases its lease, after the write, before it ends
            closing = asyncio.ensure_future(layer.aclose())
            await asyncio.sleep(0.2)  # time to cut the write short, were the close not to wait
            assert not closing.done()
        finally:
            redis_client.client_unpause()
        await asyncio.wait_for(closing, 5)
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert asyncio.all_tasks() == {asyncio.current_task()}

    try:
        asyncio.run(main())
        assert redis_client.keys("test:*:lock") == []
        assert len(redis_client.keys("test:*item:1*")) == 1  # the value, written
    finally:
        redis_client.close()


def test_a_command_after_its_loops_store_closed_is_refused_and_opens_no_connection(redis_url: str) -> None:
    """A task of the loop still going when the layer's store for that loop has closed (a
    write that outlasted the close's wait for it) is refused at its next command. Sent,
    it opened a connection of the closed pool that nothing closed: the garbage collector
    found it after the loop was gone (ResourceWarnings in a later test, in CI)."""
    watcher = redis.Redis.from_url(redis_url)

    def clients() -> set[str]:
        return {client["id"] for client in watcher.client_list()}

    before = clients()  # (an earlier test's connection may close meanwhile: ids, not a count)
    layer = Stampede.from_url(redis_url, namespace="straggler", near_cache=False)

    async def main() -> None:
        store = layer.loop_store()
        assert await store.get("straggler:x") is None  # its pool has a connection
        assert clients() - before
        await layer.aclose()
        with pytest.raises(BackendUnavailable, match="closed"):
            await store.get("straggler:x")
        with pytest.raises(BackendUnavailable, match="closed"):
            await store.get_many(["straggler:x", "straggler:y"])

    try:
        asyncio.run(main())
        until_closed = time.monotonic() + 5
        while clients() - before:
            assert time.monotonic() < until_closed, "a connection of the closed store is still open"
            time.sleep(0.01)
    finally:
        layer.close()
        watcher.close()


def test_a_cancelled_waiter_cancels_only_itself(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend()

    async def main() -> None:
        db = AsyncDatabase(blocked=True)
        load = layer.cached_loader("item:{key}")(db)
        leader = asyncio.ensure_future(load(1))
        waiters = [asyncio.ensure_future(load(1)) for _ in range(5)]
        await asyncio.wait_for(db.started.wait(), 5)
        waiters[0].cancel()
        await asyncio.sleep(0)  # let the cancellation land before the leader finishes
        db.release.set()
        assert await leader == {"id": 1}
        assert await asyncio.gather(*waiters[1:]) == [{"id": 1}] * 4
        with pytest.raises(asyncio.CancelledError):
            await waiters[0]
        assert db.total == 1

    asyncio.run(main())


def test_a_task_joining_a_load_after_another_layers_invalidation_reads_afresh(
    make_layer: Callable[..., Stampede],
) -> None:
    layer_a, layer_b = make_layer(), make_layer()  # two processes' worth of state

    async def main() -> None:
        version = {"n": 1}
        started, release = asyncio.Event(), asyncio.Event()

        async def query(key: int) -> dict[str, int]:
            seen = version["n"]
            started.set()
            await release.wait()
            return {"id": key, "version": seen}

        load_a = layer_a.cached_loader("item:{key}")(query)
        load_b = layer_b.cached_loader("item:{key}")(query)
        leader = asyncio.ensure_future(load_b(1))
        await asyncio.wait_for(started.wait(), 5)
        version["n"] = 2
        await load_a.invalidate(1)  # layer B's flight table does not hear of it
        late = asyncio.ensure_future(load_b(1))
        await asyncio.sleep(0)  # the late task runs up to its wait on B's flight
        started.clear()
        release.set()
        assert await leader == {"id": 1, "version": 1}  # its call began before the invalidation
        assert await late == {"id": 1, "version": 2}  # not handed the unwritten value
        await layer_a.aclose()
        await layer_b.aclose()

    asyncio.run(main())
    assert layer_b.stats()["stale_writes_prevented"] == 1


@pytest.mark.parametrize("window", ["read", "write"])
def test_a_task_arriving_after_an_invalidation_elsewhere_is_not_handed_an_earlier_reply(
    window: str, proxy: FaultProxy, redis_client: redis.Redis, make_layer: Callable[..., Stampede]
) -> None:
    """As the blocking test in test_faults: B's GET (or write) has run on the server, its
    reply held back by the network, when A invalidates; a task of B arriving after that
    gets the new version, not the reply."""
    # The held reply must outlast any stall of a loaded machine (as the blocking test's).
    layer_b = make_layer(proxy.url, namespace="window", lock_ttl=30, socket_timeout=30)
    layer_a = make_layer(namespace="window")
    command = "get" if window == "read" else "evalsha"

    async def main() -> None:
        version = {"n": 1}
        db = AsyncDatabase()

        async def query(key: int) -> dict[str, int]:
            await db(key)
            return {"id": key, "version": version["n"]}

        load_b = layer_b.cached_loader("doc:{key}")(query)
        load_a = layer_a.cached_loader("doc:{key}")(query)
        await load_b(0)  # loads B's scripts: a NOSCRIPT reply held back would stall the test
        db.started.clear()
        if window == "read":
            assert await load_b(1) == {"id": 1, "version": 1}  # cached
            sent = commands_run(redis_client, command)
            proxy.stall_replies()
            first = asyncio.ensure_future(load_b(1))
        else:
            db.release.clear()
            first = asyncio.ensure_future(load_b(1))
            await asyncio.wait_for(db.started.wait(), 5)
            sent = commands_run(redis_client, command)
            proxy.stall_replies()
            db.release.set()
        await until(lambda: commands_run(redis_client, command) > sent, f"B's {command} to run", timeout=30)
        version["n"] = 2
        await load_a.invalidate(1)
        late = asyncio.ensure_future(load_b(1))
        flights = layer_b._async_runner._loops[asyncio.get_running_loop()].flights  # type: ignore[union-attr]
        await until(lambda: flights._flights[load_b.key(1)].done, "the late task to join", timeout=30)
        proxy.flow()
        assert await first == {"id": 1, "version": 1}  # its call began before the invalidation
        assert await late == {"id": 1, "version": 2}
        assert db.calls[1] == 2
        await layer_a.aclose()
        await layer_b.aclose()

    asyncio.run(main())


def test_arguments_that_make_no_key_raise_when_awaited_as_from_an_async_def(
    make_layer: Callable[..., Stampede],
) -> None:
    layer = make_layer()
    calls: list[object] = []

    @layer.cached_loader("item:{key}")
    async def item(key: object) -> int:
        calls.append(key)
        return 1

    outer = make_layer(namespace="outer").cached_loader("outer:{key}")(item)  # stacked: still async

    async def main() -> None:
        unbuildable = item(object())  # no canonical form: InvalidKey, but only once awaited
        with pytest.raises(InvalidKey):
            await unbuildable
        wrong = item(1, 2)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            await wrong
        assert await outer(3) == 1

    asyncio.run(main())
    assert calls == [3]


def test_an_async_loader_is_an_async_callable_to_frameworks(make_layer: Callable[..., Stampede]) -> None:
    """Frameworks decide whether to await an endpoint or a dependency by asking whether
    it is a coroutine function: FastAPI asks ``inspect`` of its ``__call__``, Starlette
    asks of the object and of its ``__call__``. An async loader must answer yes to each,
    or it is run as a plain function and its coroutine is never awaited."""
    layer = make_layer()

    @layer.cached_loader("item:{key}")
    async def item(key: int) -> int:
        return key

    class Repository:
        @layer.cached_loader("row:{row_id}")
        async def row(self, row_id: int) -> int:
            return row_id

    method = Repository().row  # bound to its instance, as obj.method is
    for loader in (item, method):
        assert inspect.iscoroutinefunction(type(loader).__call__)
        assert inspect.iscoroutinefunction(loader.__call__)
        if sys.version_info >= (3, 12):  # inspect.markcoroutinefunction: the object itself too
            assert inspect.iscoroutinefunction(loader)
        for name in ("fetch", "invalidate", "expire"):
            assert inspect.iscoroutinefunction(getattr(loader, name)), name

    async def main() -> None:
        assert await item(7) == 7
        assert await method(8) == 8
        assert (await method.fetch(8)).value == 8
        await method.invalidate(8)
        await method.expire(8)

    asyncio.run(main())


def test_several_event_loops_in_threads_share_one_load(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend()
    calls: list[int] = []
    calls_lock = threading.Lock()
    barrier = threading.Barrier(4)

    @layer.cached_loader("item:{key}")
    async def load(key: int) -> dict[str, int]:
        with calls_lock:
            calls.append(key)
        await asyncio.sleep(0.2)
        return {"id": key}

    async def burst() -> list[Any]:
        return await asyncio.gather(*(load(1) for _ in range(50)))

    def one_loop() -> list[Any]:
        barrier.wait(10)
        return asyncio.run(burst())

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: one_loop(), range(4)))
    assert results == [[{"id": 1}] * 50] * 4
    assert calls == [1]


def test_blocking_and_async_callers_of_one_key_share_one_load(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend()
    calls: list[str] = []
    calls_lock = threading.Lock()
    barrier = threading.Barrier(9)

    @layer.cached_loader("item:{key}")
    def load_blocking(key: int) -> dict[str, int]:
        with calls_lock:
            calls.append("blocking")
        time.sleep(0.2)
        return {"id": key}

    @layer.cached_loader("item:{key}")
    async def load_async(key: int) -> dict[str, int]:
        with calls_lock:
            calls.append("async")
        await asyncio.sleep(0.2)
        return {"id": key}

    async def tasks() -> list[Any]:
        barrier.wait(10)
        return await asyncio.gather(*(load_async(1) for _ in range(50)))

    def thread() -> Any:
        barrier.wait(10)
        return load_blocking(1)

    with ThreadPoolExecutor(9) as pool:
        blocking = [pool.submit(thread) for _ in range(8)]
        assert asyncio.run(tasks()) == [{"id": 1}] * 50
        assert [future.result(10) for future in blocking] == [{"id": 1}] * 8
    assert len(calls) == 1


# --- Redis only ----------------------------------------------------------------------


def test_sync_threads_async_tasks_and_another_process_load_once(
    make_layer: Callable[..., Stampede], redis_url: str, redis_client: redis.Redis
) -> None:
    layer = make_layer(namespace="proc")
    counter = redis.Redis.from_url(redis_url, socket_timeout=5)

    @layer.cached_loader("item:{key}")
    def load_blocking(key: int) -> dict[str, int]:
        counter.incr(f"calls:{key}")
        time.sleep(0.3)
        return {"key": key}

    @layer.cached_loader("item:{key}")
    async def load_async(key: int) -> dict[str, int]:
        counter.incr(f"calls:{key}")
        await asyncio.sleep(0.3)
        return {"key": key}

    workers = Workers()
    try:
        other = workers.start(redis_url, "--threads", "16", "--delay", "0.3")
        workers.expect(other, "ready")
        barrier = threading.Barrier(9)

        async def tasks() -> list[Any]:
            barrier.wait(10)
            return await asyncio.gather(*(load_async(0) for _ in range(100)))

        def thread() -> Any:
            barrier.wait(10)
            return load_blocking(0)

        workers.go([other])
        with ThreadPoolExecutor(8) as pool:
            blocking = [pool.submit(thread) for _ in range(8)]
            assert asyncio.run(tasks()) == [{"key": 0}] * 100
            assert [future.result(10) for future in blocking] == [{"key": 0}] * 8
        result = workers.result(other)
    finally:
        workers.stop_all()
    assert result["wrong"] == [] and result["calls"] == 16
    assert int(redis_client.get("calls:0") or 0) == 1


def test_a_killed_holder_process_is_taken_over_by_async_waiters(
    make_layer: Callable[..., Stampede], redis_url: str, redis_client: redis.Redis, figures: Callable[..., None]
) -> None:
    layer = make_layer(namespace="proc", lock_ttl=1, wait_timeout=10)
    counter = redis.Redis.from_url(redis_url, socket_timeout=5)

    @layer.cached_loader("item:{key}")
    async def load(key: int) -> dict[str, int]:
        counter.incr(f"calls:{key}")
        return {"key": key}

    workers = Workers()
    try:
        holder = workers.start(redis_url, "--threads", "1", "--hang", "--lock-ttl", "1")
        workers.expect(holder, "ready")
        workers.go([holder])
        workers.expect(holder, "loading")  # it holds the lock; its watchdog renews it

        async def main() -> tuple[list[Any], float]:
            waiters = asyncio.gather(*(load(0) for _ in range(100)))
            deadline = time.monotonic() + 10
            while redis_client.pubsub_numsub("proc:{item:0}:notify")[0][1] < 1:
                assert time.monotonic() < deadline, "the async waiter never subscribed"
                await asyncio.sleep(0.01)
            holder.kill()  # SIGKILL mid-load: no release, no write
            killed_at = time.monotonic()
            results = await waiters
            return results, time.monotonic() - killed_at

        results, finished = asyncio.run(main())
    finally:
        workers.stop_all()
    figures("lock holder SIGKILLed (lease 1 s), 100 coroutines waiting", worst=finished, deadline=5,
            loads=int(redis_client.get("calls:0") or 0), bound=2)  # fmt: skip
    assert results == [{"key": 0}] * 100
    assert int(redis_client.get("calls:0") or 0) == 2  # the dead holder's and one takeover
    assert layer.stats()["takeovers"] == 1
    assert finished < 5  # about one lease (1 s), far from wait_timeout
    assert not redis_client.exists("proc:{item:0}:lock")


def test_round_trips_of_an_async_hit_and_miss(make_layer: Callable[..., Stampede], redis_url: str) -> None:
    # The commands of the plain path: the test modes' near cache and freshness (a hit's
    # PTTL, a near hit's none) are other paths, counted in their own tests.
    layer = make_layer(near_cache=False, stale_while_revalidate=0, stale_if_error=0, early_refresh=0)
    db_calls: list[int] = []

    @layer.cached_loader("item:{key}")
    async def load(key: int) -> dict[str, int]:
        db_calls.append(key)
        return {"id": key}

    async def main() -> None:
        await load(0)  # loads the scripts, opens a connection
        with CommandMonitor(redis_url) as monitor:
            assert await load(0) == {"id": 0}
            assert names(monitor.checkpoint()) == ["GET"]
            assert await asyncio.gather(*(load(1) for _ in range(200))) == [{"id": 1}] * 200
            assert names(monitor.checkpoint()) == ["GET", "EVALSHA", "EVALSHA"]  # read, lock, write
        await layer.aclose()

    asyncio.run(main())


def test_async_waiters_survive_a_lost_subscriber_connection(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    holder_layer, waiter_layer = make_layer(), make_layer(recheck_interval=30)
    release = threading.Event()
    started = threading.Event()

    @holder_layer.cached_loader("item:{key}")
    def hold(key: int) -> dict[str, int]:
        started.set()
        assert release.wait(10)
        return {"id": key}

    @waiter_layer.cached_loader("item:{key}")
    async def wait(key: int) -> dict[str, int]:
        raise AssertionError("the waiter must not load")

    channel = hold.key(1) + ":notify"

    async def main() -> Any:
        waiting = asyncio.ensure_future(wait(1))
        while redis_client.pubsub_numsub(channel)[0][1] < 1:
            await asyncio.sleep(0.01)
        redis_client.client_kill_filter(_type="pubsub")  # the subscriber's connection drops
        while redis_client.pubsub_numsub(channel)[0][1] < 1:  # and comes back
            await asyncio.sleep(0.01)
        release.set()
        return await asyncio.wait_for(waiting, 5)

    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(hold, 1)
        assert started.wait(5)
        assert asyncio.run(main()) == {"id": 1}
        assert held.result(5) == {"id": 1}


@pytest.mark.parametrize("policy", ["load", "raise"])
def test_a_stopped_server_applies_the_redis_error_policy(own_server: RedisServer, policy: str) -> None:
    layer = Stampede.from_url(own_server.url, socket_timeout=0.5, socket_connect_timeout=0.5, on_backend_error=policy)
    calls: list[int] = []

    @layer.cached_loader("item:{key}")
    async def load(key: int) -> dict[str, int]:
        calls.append(key)
        return {"id": key}

    async def main() -> None:
        assert await load(1) == {"id": 1}
        own_server.stop()
        started = time.monotonic()
        if policy == "load":
            assert await load(2) == {"id": 2}
        else:
            with pytest.raises(BackendUnavailable):
                await load(2)
        assert time.monotonic() - started < 2  # one bounded attempt, no retries

    try:
        asyncio.run(main())
    finally:
        layer.close()
    assert calls == ([1, 2] if policy == "load" else [1])


@pytest.mark.parametrize("policy", ["load", "raise"])
def test_a_lock_held_past_wait_timeout_applies_the_policy(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis, policy: str
) -> None:
    layer = make_layer(wait_timeout=0.3, on_wait_timeout=policy)
    calls: list[int] = []

    @layer.cached_loader("item:{key}")
    async def load(key: int) -> dict[str, int]:
        calls.append(key)
        return {"id": key}

    redis_client.set(load.key(1) + ":lock", "another holder", px=10_000)

    async def main() -> None:
        started = time.monotonic()
        if policy == "load":
            assert await load(1) == {"id": 1}
        else:
            with pytest.raises(WaitTimeout):
                await load(1)
        assert time.monotonic() - started < 2

    asyncio.run(main())
    assert calls == ([1] if policy == "load" else [])
    assert not redis_client.exists(load.key(1))  # loaded without caching


def test_more_concurrent_keys_than_connections_wait_for_a_slot(make_layer: Callable[..., Stampede]) -> None:
    """300 keys' calls share 4 connections: each waits for a free one (one socket timeout
    at most, here 10 s: a busy machine's 1,500 commands on 4 connections take seconds),
    none fails for the want of one."""
    layer = make_layer(max_connections=4, socket_timeout=10)

    async def main() -> None:
        db = AsyncDatabase(delay=0.01)
        load = layer.cached_loader("item:{key}")(db)
        results = await asyncio.gather(*(load(key) for key in range(300)))
        assert results == [{"id": key} for key in range(300)]
        assert db.calls == {key: 1 for key in range(300)}

    asyncio.run(main())
    assert layer.stats()["redis_errors"] == 0


def test_a_given_async_client_or_a_function_making_one_per_loop(redis_url: str) -> None:
    blocking = redis.Redis.from_url(redis_url, socket_timeout=2)
    made: list[redis.asyncio.Redis] = []

    def make_client() -> redis.asyncio.Redis:
        made.append(redis.asyncio.Redis.from_url(redis_url, socket_timeout=2))
        return made[-1]

    async def burst(layer: Stampede) -> None:
        db = AsyncDatabase(delay=0.01)
        load = layer.cached_loader("given:{key}", ttl=0.5)(db)
        assert await asyncio.gather(*(load(1) for _ in range(20))) == [{"id": 1}] * 20
        await load.invalidate(1)
        assert db.total == 1

    async def with_given_client() -> None:
        client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=2)
        await burst(Stampede(blocking, async_client=client, namespace="given"))
        await client.aclose()

    asyncio.run(with_given_client())
    layer = Stampede(blocking, async_client=make_client, namespace="given")
    asyncio.run(burst(layer))
    asyncio.run(burst(layer))  # a second loop gets a client of its own
    assert len(made) == 2 and made[0] is not made[1]
    layer.close()
    blocking.close()
