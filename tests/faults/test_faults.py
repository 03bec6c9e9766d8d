"""Faults with real processes: a lock holder paused past its lease, and the cache server
killed and restarted mid-stampede. Loader calls are counted on the shared server
(``redis_url``), which outlives the cache server a test kills (``own_server``).

A holder paused (SIGSTOP) past its lease and resumed must not overwrite the value
written by the process that took over, and must not release a lock that is now someone
else's: its lease was lost, so its write is refused by token. Timeline (lease 0.6 s,
renewed every 0.2 s by the holder's watchdog):

    t=0    A takes the lock and starts a 2 s load; SIGSTOP: its watchdog stops too
    t=0.6  A's lease runs out; B takes over, loads, writes {"by": "B"}, releases
    t~1    the entry is invalidated; C takes the lock and hangs in its load
    t~1.5  SIGCONT: A's load ends; its write finds C's lock, not A's: nothing written
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from stampede import Stampede
from stampede._backends.mailbox import ThreadMailbox
from stampede.testing import FaultProxy, RedisServer

from ..promises.test_behaviour import CountingLoader
from ..promises.test_processes import Workers
from ..scenarios import commands_run, parked_in, wait_until

KEY, LOCK = "proc:{item:0}", "proc:{item:0}:lock"


@pytest.mark.timing
def test_a_holder_paused_past_its_lease_neither_overwrites_nor_releases_anothers_lock(
    redis_url: str, redis_client: redis.Redis, make_layer: Callable[..., Stampede], figures: Callable[..., None]
) -> None:
    workers = Workers()
    lease = ["--lock-ttl", "0.6"]
    try:
        paused = workers.start(redis_url, "--threads", "1", "--delay", "2", "--announce", "--tag", "A", *lease)
        # The taker is ready before the holder pauses: started after, its start-up could
        # outlast the 0.6 s lease, and it would find the lock free, not take it over.
        taker = workers.start(redis_url, "--threads", "2", "--delay", "0.05", "--tag", "B", *lease)
        workers.expect(paused, "ready")
        workers.expect(taker, "ready")
        workers.go([paused])
        workers.expect(paused, "loading")
        os.kill(paused.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()

        workers.go([taker])
        took_over = workers.result(taker)
        taken_over_in = time.monotonic() - stopped_at
        assert took_over["stats"]["takeovers"] == 1 and took_over["wrong"] == []
        assert taken_over_in < 5  # within about one lease, not wait_timeout

        checker = make_layer(namespace="proc")
        read = checker.cached_loader("item:{key}")(lambda key: {"key": key, "by": "checker"})
        assert read(0) == {"key": 0, "by": "B"}
        read.invalidate(0)
        holder = workers.start(redis_url, "--threads", "1", "--hang", *lease)
        workers.expect(holder, "ready")
        workers.go([holder])
        workers.expect(holder, "loading")  # C holds the lock now, renewed by its watchdog
        lock_of_c = redis_client.get(LOCK)
        assert lock_of_c is not None

        os.kill(paused.pid, signal.SIGCONT)
        resumed = workers.result(paused)
        figures("lock holder SIGSTOPped past its lease (0.6 s), then resumed", worst=taken_over_in, deadline=5,
                loads=int(redis_client.get("calls:0") or 0), bound=3)  # fmt: skip
        assert resumed["stats"]["stale_writes_prevented"] == 1  # its write was refused by token
        assert resumed["wrong"] == []  # its caller still got the value it loaded
        assert redis_client.get(LOCK) == lock_of_c  # C's lock untouched
        assert not redis_client.exists(KEY)  # and A's stale value not written
        assert int(redis_client.get("calls:0") or 0) == 3  # A, B and C: no other load
    finally:
        for process in workers.processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
        workers.stop_all()
    assert not redis_client.exists(LOCK) or redis_client.pttl(LOCK) <= 600  # C's lease runs out


def test_redis_killed_and_restarted_mid_stampede(
    own_server: RedisServer, redis_url: str, redis_client: redis.Redis, figures: Callable[..., None]
) -> None:
    """Two processes of 8 threads on one cold key; the cache server is SIGKILLed while the
    holder loads and the other process waits on pub/sub, and restarted empty. Nobody
    hangs and everyone gets the right value. Loads: the holder's (its write is refused:
    the new server has no lease of it), at most one more in its process (the callers who
    joined it start over: an unwritten value is never handed on), and at most one in the
    waiting process (through the new server, or without the cache while it was down)."""
    workers = Workers()
    options = ["--count-url", redis_url, "--threads", "8", "--lock-ttl", "1", "--wait-timeout", "10"]
    cache = redis.Redis.from_url(own_server.url, socket_timeout=2)
    try:
        holder = workers.start(own_server.url, *options, "--delay", "1.5", "--announce")
        waiter = workers.start(own_server.url, *options, "--delay", "0.05")  # started now: a slow start
        workers.expect(holder, "ready")  # under load would outlast the holder's load
        workers.expect(waiter, "ready")
        workers.go([holder])
        workers.expect(holder, "loading")
        workers.go([waiter])
        wait_until(lambda: cache.pubsub_numsub(KEY + ":notify")[0][1] >= 1, "the waiter's subscription", timeout=10)
        own_server.kill()
        killed_at = time.monotonic()
        own_server.start()
        results = [workers.result(process, timeout=20) for process in (holder, waiter)]
        finished = time.monotonic() - killed_at
    finally:
        workers.stop_all()
    figures("Redis SIGKILLed and restarted empty mid-stampede, 2 processes x 8 threads",
            worst=max(result["max_latency"] for result in results), deadline=10,
            loads=int(redis_client.get("calls:0") or 0), bound=3)  # fmt: skip
    assert all(result["wrong"] == [] and result["calls"] == 8 for result in results)
    assert 1 <= int(redis_client.get("calls:0") or 0) <= 3
    assert finished < 10  # within wait_timeout: nobody waited it out
    assert max(result["max_latency"] for result in results) < 10
    assert not cache.exists(LOCK)
    cache.close()


def test_a_loader_failing_under_load_is_never_run_twice_at_once(
    make_layer: Any, redis_client: redis.Redis, figures: Callable[..., None]
) -> None:
    """16 threads in two layers (two processes' worth of flight tables and subscribers)
    call a key whose loader always fails after 50 ms, for one second. Failures are not
    cached, so calls keep coming; but the lock lets one load run at a time, across
    layers: the database sees at most one query in flight, at most 1 s / 50 ms of them."""
    layers = [make_layer(), make_layer()]
    state = {"running": 0, "most": 0, "calls": 0}
    guard = threading.Lock()

    def failing(key: int) -> Any:
        with guard:
            state["running"] += 1
            state["calls"] += 1
            state["most"] = max(state["most"], state["running"])
        time.sleep(0.05)
        with guard:
            state["running"] -= 1
        raise LookupError("the database is down")

    loads = [layer.cached_loader("failing:{key}")(failing) for layer in layers]
    outcomes: list[str] = []
    worst = [0.0]
    stop_at = time.monotonic() + 1.0

    def caller(index: int) -> None:
        while time.monotonic() < stop_at:
            started = time.monotonic()
            try:
                loads[index % 2](1)
                outcomes.append("value")
            except LookupError:
                outcomes.append("error")
            worst[0] = max(worst[0], time.monotonic() - started)

    threads = [threading.Thread(target=caller, args=(index,)) for index in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    figures("loader raising on every call, 16 threads in 2 layers for 1 s (50 ms per load)", worst=worst[0],
            deadline=1.0, loads=state["calls"], bound=int(1.0 / 0.05 + 2),
            exceptions=f"the loader's LookupError ({len(outcomes)} of {len(outcomes)} calls)")  # fmt: skip
    assert state["most"] == 1
    assert worst[0] < 1.0  # each caller waits for a load or two, never the lease or wait_timeout
    assert 5 <= state["calls"] <= 1.0 / 0.05 + 2, state
    assert outcomes and set(outcomes) == {"error"}
    assert not redis_client.exists(loads[0].key(1) + ":lock")
    assert not redis_client.exists(loads[0].key(1))


def test_connections_cut_mid_stampede(
    proxy: FaultProxy, redis_client: redis.Redis, make_layer: Callable[..., Stampede], figures: Callable[..., None]
) -> None:
    """Two layers (two processes' worth) of 8 threads reach Redis through a proxy that
    cuts every connection while one layer loads and the other waits on pub/sub. Everyone
    gets the value, nobody waits out wait_timeout, at most one load per layer."""
    layers = [make_layer(proxy.url, namespace="cut", lock_ttl=1, wait_timeout=10) for _ in range(2)]
    db = CountingLoader()
    db.release.clear()
    loads = [layer.cached_loader("item:{key}")(db) for layer in layers]
    with ThreadPoolExecutor(16) as pool:
        holders = [pool.submit(loads[0], 1) for _ in range(8)]
        assert db.started.wait(5)
        waiters = [pool.submit(loads[1], 1) for _ in range(8)]
        wait_until(
            lambda: redis_client.pubsub_numsub("cut:{item:1}:notify")[0][1] >= 1, "the waiting layer", timeout=10
        )
        proxy.cut()
        cut_at = time.monotonic()
        db.release.set()
        results = [future.result(15) for future in holders + waiters]
        elapsed = time.monotonic() - cut_at
    figures("every connection cut mid-stampede, 2 layers x 8 threads", worst=elapsed, deadline=5,
            loads=db.calls[1], bound=2)  # fmt: skip
    assert results == [{"id": 1}] * 16
    assert 1 <= db.calls[1] <= 2
    assert elapsed < 5, elapsed
    wait_until(lambda: not redis_client.exists("cut:{item:1}:lock"), "no lock left", timeout=2)


@pytest.mark.timing
def test_latency_beyond_the_socket_timeout_is_bounded_and_opens_the_circuit(
    proxy: FaultProxy, make_layer: Callable[..., Stampede], figures: Callable[..., None]
) -> None:
    """The network becomes slower than the socket timeout: each call fails open within one
    socket timeout until the breaker opens, then at once; when the network recovers and
    the cool-down ends, caching resumes."""
    layer = make_layer(proxy.url, namespace="slow", socket_timeout=0.2, socket_connect_timeout=0.2,
                       breaker_threshold=3, breaker_cooldown=0.5)  # fmt: skip
    calls: list[int] = []
    load = layer.cached_loader("item:{key}")(lambda key: calls.append(key) or key)
    assert load(0) == 0
    proxy.delay = 0.5
    timings = []
    sent_while_open = 0
    for key in range(1, 11):
        started = time.monotonic()
        sent_before = proxy.requests_received
        assert load(key) == key  # served by the loader
        timings.append(time.monotonic() - started)
        if key > 3:
            sent_while_open += proxy.requests_received - sent_before
    figures("network latency 0.5 s, socket timeout 0.2 s, 10 calls (breaker threshold 3)", worst=max(timings),
            deadline=0.45, loads=len(calls) - 1, bound="1 per call (no cache)")  # fmt: skip
    assert max(timings) < 0.2 + 0.25, timings  # one socket timeout at most
    # The circuit is open after the third failure: the later calls send nothing and wait
    # on no socket. (Counted at the proxy, not timed: a scheduler pause on a busy machine
    # is not a socket wait.)
    assert sent_while_open == 0
    assert sorted(timings[3:])[3] < 0.05, timings
    proxy.delay = 0.0
    time.sleep(0.5)  # the configured cool-down
    calls.clear()
    assert load(42) == 42 and load(42) == 42 and calls == [42]  # cached again


@pytest.mark.parametrize("window", ["read", "write"])
def test_a_caller_arriving_after_an_invalidation_elsewhere_is_not_handed_an_earlier_reply(
    window: str, proxy: FaultProxy, redis_client: redis.Redis, make_layer: Callable[..., Stampede]
) -> None:
    """Layer B has a command on the wire (its GET of the cached version 1, or the write of
    the version 1 it loaded) whose reply the network holds back, when layer A updates the
    database to version 2 and invalidates. A caller in B who arrives after that joins B's
    flight; it must not be handed what the command carried: it reads again and gets 2."""
    # The held reply must outlast any stall of a loaded machine: a read that timed out
    # (after the default 2 s) would load version 2 for the first caller too.
    layer_b = make_layer(proxy.url, namespace="window", lock_ttl=30, socket_timeout=30)
    layer_a = make_layer(namespace="window")
    database = {"version": 1}
    db = CountingLoader(result=lambda key: dict(database))
    load_b = layer_b.cached_loader("doc:{key}")(db)
    load_a = layer_a.cached_loader("doc:{key}")(db)
    load_b(0)  # loads B's scripts: a NOSCRIPT reply held back would stall the test
    db.started.clear()
    command = "get" if window == "read" else "evalsha"
    flights: Any = layer_b._runner.flights  # type: ignore[union-attr]
    with ThreadPoolExecutor(2) as pool:
        if window == "read":
            assert load_b(1) == {"version": 1}  # cached
            sent = commands_run(redis_client, command)
            proxy.stall_replies()
            first = pool.submit(load_b, 1)
        else:
            db.release.clear()
            first = pool.submit(load_b, 1)
            assert db.started.wait(5)  # B holds the lock and loads version 1
            sent = commands_run(redis_client, command)
            proxy.stall_replies()
            db.release.set()
        wait_until(lambda: commands_run(redis_client, command) > sent, f"B's {command} to run", timeout=30)
        database["version"] = 2
        load_a.invalidate(1)  # completed: B's flight table does not hear of it
        late = pool.submit(load_b, 1)
        wait_until(lambda: flights._flights[load_b.key(1)].done is not None, "the late caller to join", timeout=30)
        proxy.flow()
        assert first.result(30) == {"version": 1}  # its call began before the invalidation
        assert late.result(30) == {"version": 2}
    assert load_a(1) == {"version": 2}
    assert db.calls[1] == 2


def test_a_caller_joining_a_load_whose_write_fails_after_an_invalidation_elsewhere_reads_again(
    proxy: FaultProxy, redis_client: redis.Redis, make_layer: Callable[..., Stampede]
) -> None:
    """B is loading version 1 when A updates the database to version 2 and invalidates; a
    caller in B joins B's load after that. Then the network to B stalls and B's write
    fails on its socket timeout, so B cannot know the write would have been refused. Its
    own caller gets version 1 (its call began first); the late caller must not."""
    layer_b = make_layer(proxy.url, namespace="failed-write", socket_timeout=0.3)
    layer_a = make_layer(namespace="failed-write")
    database = {"version": 1}
    db = CountingLoader(result=lambda key: dict(database))
    db.release.clear()
    load_b = layer_b.cached_loader("doc:{key}")(db)
    load_a = layer_a.cached_loader("doc:{key}")(db)
    flights: Any = layer_b._runner.flights  # type: ignore[union-attr]
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(load_b, 1)
        assert db.started.wait(5)
        database["version"] = 2
        load_a.invalidate(1)
        late = pool.submit(load_b, 1)
        wait_until(lambda: flights._flights[load_b.key(1)].done is not None, "the late caller to join")
        proxy.stall()
        db.release.set()
        assert first.result(5) == {"version": 1}  # after the write's socket timeout
        proxy.flow()
        assert late.result(5) == {"version": 2}
    assert db.calls[1] == 2
    assert layer_b.stats()["redis_errors"] >= 1


def test_a_value_in_a_message_goes_only_to_callers_who_arrived_before_the_subscription(
    redis_client: redis.Redis, make_layer: Callable[..., Stampede]
) -> None:
    """Layer B waits for layer A's load. A message may arrive late: written before an
    invalidation that completed before a caller of B arrived, and announced after it
    (messages of one channel come in order). B's waiting leader gets such a message, which
    the test publishes, in its second wait (after a "state changed" message and a
    re-check); its own caller may have it (its call began before), but a caller who joined
    B's flight during the first wait must read again, and gets A's write."""
    layer_b = make_layer(namespace="late-message", lock_ttl=30, recheck_interval=30)
    layer_a = make_layer(namespace="late-message", lock_ttl=30)
    db = CountingLoader(result=lambda key: {"version": 2})
    db.release.clear()
    load_a = layer_a.cached_loader("doc:{key}")(db)
    load_b = layer_b.cached_loader("doc:{key}")(db)
    key = load_b.key(1)
    flights: Any = layer_b._runner.flights  # type: ignore[union-attr]
    with ThreadPoolExecutor(3) as pool:
        holder = pool.submit(load_a, 1)
        assert db.started.wait(5)
        waiter = pool.submit(load_b, 1)
        wait_until(lambda: parked_in(ThreadMailbox.wait), "B to wait for A's message")
        late = pool.submit(load_b, 1)
        flight = flights._flights[key]
        wait_until(lambda: flight.done is not None, "the late caller to join")
        commands = flight.sent  # GET, lock, subscribe, lock again
        redis_client.publish(key + ":notify", b"")  # "state changed": B re-checks and waits again
        wait_until(lambda: flight.sent > commands and parked_in(ThreadMailbox.wait), "B's second wait")
        old = load_b._spec.codec.encode({"version": 1}, time.time(), 0.0, key=key)
        redis_client.publish(key + ":notify", old)
        assert waiter.result(5) == {"version": 1}
        db.release.set()
        assert holder.result(5) == {"version": 2}
        assert late.result(5) == {"version": 2}
    assert db.calls[1] == 1
