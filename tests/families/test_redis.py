"""Redis-specific promises: round trips, leases across layers, failures of the server."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import redis

from stampede import BackendUnavailable, CachedLoader, ConfigError, Stampede
from stampede._backends.redis.clients import ConnectionQueue
from stampede.testing import CommandMonitor, RedisServer, names

from ..modes import hammer
from ..promises.test_behaviour import CountingLoader
from ..scenarios import forked_child_passes, wait_until


def subscribers(client: redis.Redis, loader: CachedLoader[..., Any], *args: Any) -> int:
    """How many connections listen on the channel of ``loader(*args)``'s entry."""
    return int(client.pubsub_numsub(loader.key(*args) + ":notify")[0][1])


def hold_and_wait(
    pool: ThreadPoolExecutor,
    holder: CachedLoader[..., Any],
    holder_db: CountingLoader,
    waiter: CachedLoader[..., Any],
    client: redis.Redis,
) -> tuple[Future[Any], Future[Any]]:
    """Start ``holder(1)`` (its loader blocked until ``holder_db.release``), then
    ``waiter(1)`` from another layer; return once the waiter listens for the write."""
    held = pool.submit(holder, 1)
    assert holder_db.started.wait(5)
    waiting = pool.submit(waiter, 1)
    wait_until(lambda: subscribers(client, waiter, 1) == 1)
    return held, waiting


def test_round_trips_of_a_hit_a_leader_and_a_waiter(make_layer: Callable[..., Stampede], redis_url: str) -> None:
    leader_layer, waiter_layer = make_layer(), make_layer()
    db = CountingLoader()
    leader = leader_layer.cached_loader("item:{key}")(db)
    waiter = waiter_layer.cached_loader("item:{key}")(db)
    leader(0)  # loads the scripts into the server
    waiter(0)

    with CommandMonitor(redis_url) as monitor:
        assert waiter(0) == {"id": 0}
        assert names(monitor.checkpoint()) == ["GET"]  # a hit: one round trip

        assert leader(1) == {"id": 1}
        assert names(monitor.checkpoint()) == ["GET", "EVALSHA", "EVALSHA"]  # read, lock, write

        db.release.clear()
        db.started.clear()
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(leader, 2)
            assert db.started.wait(5)
            monitor.checkpoint()
            waiting = pool.submit(waiter, 2)
            wait_until(lambda: waiter_layer.stats()["lock_waits"] == 1)
            wait_until(lambda: len(monitor.checkpoint_peek()) >= 4)
            db.release.set()
            assert held.result(5) == waiting.result(5) == {"id": 2}
        sent = names(monitor.checkpoint())
    sent.remove("EVALSHA")  # the leader's write
    # The waiter: read, lock attempt, subscribe, re-check; then woken with the value.
    # Its UNSUBSCRIBE is sent without waiting for the reply: not a round trip.
    assert sorted(c for c in sent if c != "UNSUBSCRIBE") == ["EVALSHA", "EVALSHA", "GET", "SUBSCRIBE"]
    assert sent.count("UNSUBSCRIBE") <= 1
    assert db.calls == {0: 1, 1: 1, 2: 1}


@pytest.mark.timing
def test_loader_slower_than_the_lease_runs_once(make_layer: Callable[..., Stampede]) -> None:
    layers = [make_layer(lock_ttl=0.2) for _ in range(3)]
    db = CountingLoader(delay=1.0)
    loaders = [layer.cached_loader("slow:{key}")(db) for layer in layers]

    results = hammer(lambda i: loaders[i % 3](1), list(range(12)))

    assert results == [{"id": 1}] * 12
    assert db.calls == {1: 1}
    assert sum(layer.stats()["takeovers"] for layer in layers) == 0


@pytest.mark.timing
def test_a_dead_holders_lock_is_taken_over_when_its_lease_ends(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer()
    db = CountingLoader()
    load = layer.cached_loader("item:{key}")(db)
    redis_client.set(load.key(1) + ":lock", "token-of-a-dead-process", px=400)

    start = time.monotonic()
    assert load(1) == {"id": 1}
    elapsed = time.monotonic() - start

    assert 0.35 <= elapsed < 1.5
    assert db.calls == {1: 1}
    assert layer.stats()["takeovers"] == 1
    assert not redis_client.exists(load.key(1) + ":lock")


def test_a_released_lock_wakes_waiters_of_other_layers_at_once(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    first, second = make_layer(lock_ttl=10), make_layer(lock_ttl=10)
    failing = CountingLoader(result=lambda key: 1 / 0)
    failing.release.clear()
    fine = CountingLoader()
    doomed = first.cached_loader("item:{key}")(failing)
    survivor = second.cached_loader("item:{key}")(fine)

    with ThreadPoolExecutor(2) as pool:
        holder, waiting = hold_and_wait(pool, doomed, failing, survivor, redis_client)
        start = time.monotonic()
        failing.release.set()
        with pytest.raises(ZeroDivisionError):
            holder.result(5)
        assert waiting.result(5) == {"id": 1}
    assert time.monotonic() - start < 1.0  # not the 10 s lease
    assert fine.calls == {1: 1}


def test_a_holder_whose_lease_was_lost_does_not_overwrite_the_new_value(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    old_layer, new_layer = make_layer(), make_layer()
    database = {"version": 1}
    slow = CountingLoader(result=lambda key: dict(database))
    slow.release.clear()
    stale = old_layer.cached_loader("doc:{key}")(slow)
    fresh = new_layer.cached_loader("doc:{key}")(lambda key: dict(database))

    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(stale, 1)
        assert slow.started.wait(5)
        redis_client.delete(stale.key(1) + ":lock")  # the lease ran out (a long GC pause, say)
        database["version"] = 2
        assert fresh(1) == {"version": 2}  # a new holder loads and writes
        slow.release.set()
        assert in_flight.result(5) == {"version": 1}  # to its own caller only

    assert stale(1) == {"version": 2}
    assert old_layer.stats()["stale_writes_prevented"] == 1


def test_a_lease_asked_for_twice_with_one_token_is_granted_twice(redis_client: redis.Redis) -> None:
    """A pipeline sent again after it failed on another server (see
    ``RedisStore._over_nodes``) asks again for leases it may already hold: granted, and
    renewed, where a second holder is refused."""
    from stampede._backends.redis import scripts
    from stampede._core.keys import EntryKeys

    keys = EntryKeys.for_value("t:{twice}")
    acquire = redis_client.register_script(scripts.ACQUIRE)
    call = scripts.acquire_call(keys, "token-1", 5000, True)
    assert acquire(call.keys, call.args) == [2]
    redis_client.pexpire(keys.lock, 100)
    assert acquire(call.keys, call.args) == [2]
    assert redis_client.pttl(keys.lock) > 4000  # the lease asked for again, from now
    other = scripts.acquire_call(keys, "token-2", 5000, True)
    assert acquire(other.keys, other.args)[0] == 3


def test_an_invalidation_in_another_process_reaches_callers_who_join_the_load_after_it(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    """Process B is loading version 1 when process A updates the database and invalidates.
    A caller in B who arrives after that joins B's load in flight, whose write is now
    refused; it must not be handed version 1: it starts over and reads version 2."""
    layer_a, layer_b = make_layer(), make_layer()
    database = {"version": 1}
    db = CountingLoader(result=lambda key: dict(database))
    db.release.clear()
    load_b = layer_b.cached_loader("doc:{key}")(db)
    load_a = layer_a.cached_loader("doc:{key}")(db)

    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(load_b, 1)
        assert db.started.wait(5)
        database["version"] = 2
        load_a.invalidate(1)  # in "process" A: B's flight table does not hear of it
        late = pool.submit(load_b, 1)
        flights: Any = layer_b._runner.flights  # type: ignore[union-attr]
        wait_until(lambda: flights._flights[load_b.key(1)].done is not None, "the late caller to join")
        db.release.set()
        assert leader.result(5) == {"version": 1}  # its own call began before the invalidation
        assert late.result(5) == {"version": 2}

    assert load_a(1) == {"version": 2} and load_b(1) == {"version": 2}
    assert db.calls == {1: 2}
    assert layer_b.stats()["stale_writes_prevented"] == 1


def test_values_too_large_to_travel_in_the_message_are_read_back(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layers = [make_layer(inline_value_limit=0) for _ in range(2)]
    db = CountingLoader(result=lambda key: {"blob": "x" * 100_000}, delay=0.2)
    loaders = [layer.cached_loader("big:{key}")(db) for layer in layers]

    results = hammer(lambda i: loaders[i % 2](1), list(range(8)))

    assert all(r == {"blob": "x" * 100_000} for r in results)
    assert db.calls == {1: 1}


def test_ttl_is_jittered_within_bounds(make_layer: Callable[..., Stampede], redis_client: redis.Redis) -> None:
    layer = make_layer(ttl=100, jitter=0.1)
    load = layer.cached_loader("item:{key}")(CountingLoader())
    ttls = set()
    for key in range(20):
        load(key)
        ttls.add(redis_client.pttl(load.key(key)))
        assert not redis_client.exists(load.key(key) + ":lock")
    assert all(89_000 <= ttl <= 110_000 for ttl in ttls)
    assert len(ttls) > 1


def test_closing_a_layer_from_a_url_closes_every_connection_it_opened(redis_url: str) -> None:
    watcher = redis.Redis.from_url(redis_url)
    try:

        def clients() -> set[str]:
            return {client["id"] for client in watcher.client_list()}

        before = clients()  # (an earlier test's connection may close meanwhile: ids, not a count)
        layer = Stampede.from_url(redis_url, namespace="closing")
        load = layer.cached_loader("item:{key}")(CountingLoader())
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(load, range(8)))  # several pooled connections, and the subscriber's
        assert len(clients() - before) > 1
        layer.close()
        wait_until(lambda: not clients() - before, "the layer's connections to close")
    finally:
        watcher.close()


def test_blocking_callers_beyond_max_connections_wait_for_a_connection(
    make_layer: Callable[..., Stampede], redis_url: str
) -> None:
    layer = make_layer(max_connections=4)
    db = CountingLoader(delay=0.01)
    load = layer.cached_loader("item:{key}")(db)
    assert hammer(load, list(range(150))) == [{"id": key} for key in range(150)]
    assert db.calls == {key: 1 for key in range(150)}  # no caller was served without the cache
    assert layer.stats()["redis_errors"] == 0
    pool = layer._runner.store.client.connection_pool  # type: ignore[union-attr]
    assert len(pool._connections) <= 4  # never more than the bound


def test_the_pools_queue_hands_out_the_last_connection_back_and_wakes_one_waiter() -> None:
    free = ConnectionQueue(2)
    free.put_nowait("a")
    free.put_nowait("b")
    with pytest.raises(queue.Full):
        free.put_nowait("c")
    assert [free.get(), free.get()] == ["b", "a"]  # last in, first out: warm connections first
    with pytest.raises(queue.Empty):
        free.get(block=False)
    started = time.monotonic()
    with pytest.raises(queue.Empty):
        free.get(timeout=0.05)
    assert 0.05 <= time.monotonic() - started < 2
    taken: list[str] = []
    waiting = threading.Thread(target=lambda: taken.append(free.get(timeout=10)))
    waiting.start()
    wait_until(lambda: free._getters == 1, "the getter to wait")
    free.put_nowait("d")
    waiting.join(10)
    assert taken == ["d"] and free.queue == [] and free._getters == 0


def test_a_client_decoding_responses_is_refused(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="decode_responses"):
        Stampede(redis.Redis.from_url(redis_url, decode_responses=True))


def test_redis_stopped_mid_run_fails_open_and_caching_resumes(
    own_server: RedisServer, figures: Callable[..., None]
) -> None:
    # The breaker stays shut (threshold 0): whether the refusals open it depends on how
    # many loads the threads started, and an open breaker would delay caching after the
    # restart by its cooldown (test_breaker covers it).
    layer = Stampede.from_url(own_server.url, socket_timeout=0.5, socket_connect_timeout=0.5, breaker_threshold=0)
    db = CountingLoader(delay=0.3)  # long enough for every thread to join the one flight
    load = layer.cached_loader("item:{key}")(db)
    try:
        assert load(1) == {"id": 1}
        own_server.stop()

        started = time.monotonic()
        results = hammer(load, [1] * 8 + [2] * 8)  # served by the loader, still collapsed per process
        elapsed = time.monotonic() - started
        figures("Redis stopped, on_backend_error=\"load\", 16 threads on 2 keys (load 0.3 s)", worst=elapsed,
                deadline=2.0, loads=db.calls[1] - 1 + db.calls[2], bound=4)  # fmt: skip
        assert elapsed < 2.0  # two loads in a row at most, each after a refused connection
        assert results == [{"id": 1}] * 8 + [{"id": 2}] * 8
        # one load per key, and one more for callers who arrived after it began: a value
        # loaded without the lease is not handed to them (see _drivers.singleflight)
        assert 2 <= db.calls[1] <= 3 and 1 <= db.calls[2] <= 2, db.calls
        assert layer.stats()["redis_errors"] > 0
        with pytest.raises(BackendUnavailable):
            load.invalidate(1)  # an invalidation never fails silently

        own_server.start()
        before = dict(db.calls)
        assert load(3) == {"id": 3}
        assert load(3) == {"id": 3}
        assert db.calls[3] == before.get(3, 0) + 1  # cached again, no restart of the layer
    finally:
        layer.close()


@pytest.mark.timing
def test_policy_raise_surfaces_a_dead_redis(own_server: RedisServer, figures: Callable[..., None]) -> None:
    layer = Stampede.from_url(own_server.url, on_backend_error="raise", socket_timeout=0.5)
    db = CountingLoader()
    load = layer.cached_loader("item:{key}")(db)
    try:
        own_server.stop()
        started = time.monotonic()
        with pytest.raises(BackendUnavailable) as raised:
            load(1)
        elapsed = time.monotonic() - started
        figures("Redis stopped, on_backend_error=\"raise\"", worst=elapsed, deadline=0.5, loads=sum(db.calls.values()),
                bound=0, exceptions="BackendUnavailable naming the key and the cause")  # fmt: skip
        assert elapsed < 0.5  # a refused connection: no waiting
        assert raised.value.key == load.key(1)
        assert db.calls == {}
    finally:
        layer.close()


@pytest.mark.timing
def test_a_stalled_server_costs_one_socket_timeout(own_server: RedisServer) -> None:
    layer = Stampede.from_url(own_server.url, socket_timeout=0.3, socket_connect_timeout=0.3)
    db = CountingLoader()
    load = layer.cached_loader("item:{key}")(db)
    try:
        assert load(1) == {"id": 1}  # connections are open before the stall
        own_server.pause()
        start = time.monotonic()
        assert load(2) == {"id": 2}
        elapsed = time.monotonic() - start
        assert elapsed < 0.3 + 0.4, f"a stalled server cost {elapsed:.2f} s"
    finally:
        own_server.resume()
        layer.close()


def test_waiters_survive_a_lost_subscriber_connection(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    holder_layer, waiter_layer = make_layer(), make_layer(recheck_interval=5)
    db = CountingLoader()
    db.release.clear()
    holder = holder_layer.cached_loader("item:{key}")(db)
    waiter = waiter_layer.cached_loader("item:{key}")(db)

    with ThreadPoolExecutor(2) as pool:
        held, waiting = hold_and_wait(pool, holder, db, waiter, redis_client)
        redis_client.client_kill_filter(_type="pubsub")  # the subscriber's connection drops
        wait_until(lambda: subscribers(redis_client, waiter, 1) == 1)  # and comes back
        start = time.monotonic()
        db.release.set()
        assert held.result(5) == waiting.result(5) == {"id": 1}
    assert time.monotonic() - start < 2.0  # woken by the message, not the 5 s re-check
    assert db.calls == {1: 1}


def test_a_forked_child_gets_its_own_subscriber_and_watchdog(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    import os

    layer = make_layer()
    db = CountingLoader()
    db.release.clear()
    holder_layer = make_layer()
    holder = holder_layer.cached_loader("item:{key}")(db)
    load = layer.cached_loader("item:{key}")(lambda key: {"id": key, "loaded_by": "the waiter"})
    # The parent's subscriber connects and its reader thread starts before the fork.
    redis_client.set(load.key(0) + ":lock", "someone", px=200)
    assert load(0) == {"id": 0, "loaded_by": "the waiter"}

    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(holder, 1)
        assert db.started.wait(5)
        pid = os.fork()
        if pid == 0:  # the child waits for the holder's load through its own subscriber
            code = 0 if load(1) == {"id": 1} and layer.stats()["redis_errors"] == 0 else 1
            os._exit(code)
        wait_until(lambda: subscribers(redis_client, load, 1) >= 1)
        db.release.set()
        assert held.result(5) == {"id": 1}
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert db.calls == {1: 1}


def test_a_child_forked_while_the_counters_lock_is_held_still_serves_hits(make_layer: Callable[..., Stampede]) -> None:
    """Every call takes the layer's counter lock to count itself. A fork while a parent's
    thread holds it (here the forking thread itself) must not leave the child's calls
    waiting for a lock nobody in the child will release."""
    layer = make_layer()
    load = layer.cached_loader("item:{key}")(lambda key: {"id": key})
    assert load(1) == {"id": 1}
    hits_before = layer.stats()["hits"]
    # as a thread mid-increment holds it
    assert forked_child_passes(
        lambda: load(1) == {"id": 1} and layer.stats()["hits"] == hits_before + 1, layer._events.counts.lock
    )
    assert layer.stats()["hits"] == hits_before  # the parent's counts are its own
