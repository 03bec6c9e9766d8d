"""The circuit breaker: its rules with a fake clock, then a stalled real server that
stops costing every caller a socket timeout once the circuit opens."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from stampede import BackendUnavailable, Stampede
from stampede._backends.breaker import CircuitBreaker
from stampede.testing import RedisServer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def open_breaker(threshold: int = 3, cooldown: float = 5.0) -> tuple[CircuitBreaker, Clock]:
    clock = Clock()
    breaker = CircuitBreaker(threshold, cooldown, clock)
    for _ in range(threshold):
        breaker.check("k")
        breaker.failed()
    return breaker, clock


def test_it_opens_after_threshold_failures_in_a_row_and_refuses_at_once() -> None:
    breaker, clock = open_breaker()
    with pytest.raises(BackendUnavailable, match="circuit open"):
        breaker.check("k")
    clock.now += 4.9
    with pytest.raises(BackendUnavailable):
        breaker.check("k")


def test_a_success_between_failures_starts_the_count_again() -> None:
    breaker = CircuitBreaker(3, 5.0, Clock())
    for outcome in ("failed", "failed", "succeeded", "failed", "failed"):
        breaker.check("k")
        getattr(breaker, outcome)()
    breaker.check("k")  # 2 in a row: still closed


def test_after_the_cooldown_one_probe_goes_and_its_success_closes_the_circuit() -> None:
    breaker, clock = open_breaker()
    clock.now += 5.0
    breaker.check("k")  # the probe
    with pytest.raises(BackendUnavailable):
        breaker.check("k")  # the others still fail at once while it is out
    breaker.succeeded()
    for _ in range(10):
        breaker.check("k")


def test_a_failed_probe_opens_the_circuit_for_another_cooldown() -> None:
    breaker, clock = open_breaker()
    clock.now += 5.0
    breaker.check("k")
    breaker.failed()
    clock.now += 4.9
    with pytest.raises(BackendUnavailable):
        breaker.check("k")
    clock.now += 0.1
    breaker.check("k")  # the next probe


def test_it_reports_each_opening_and_closing_once() -> None:
    clock, changes = Clock(), []
    breaker = CircuitBreaker(2, 5.0, clock, on_change=changes.append)
    for _ in range(2):
        breaker.failed()
    clock.now += 5.0
    breaker.check("k")
    breaker.failed()  # a failed probe: still the same opening
    clock.now += 5.0
    breaker.check("k")
    breaker.succeeded()
    breaker.succeeded()  # already closed
    assert changes == [True, False]


def test_a_probe_that_never_reports_lets_another_go_after_a_cooldown() -> None:
    breaker, clock = open_breaker()
    clock.now += 5.0
    breaker.check("k")  # a probe whose caller died
    clock.now += 5.0
    breaker.check("k")


def test_threshold_zero_never_opens() -> None:
    breaker = CircuitBreaker(0, 5.0, Clock())
    for _ in range(100):
        breaker.check("k")
        breaker.failed()


def timed(call: Any) -> tuple[Any, float]:
    start = time.monotonic()
    result = call()
    return result, time.monotonic() - start


@pytest.mark.timing
def test_a_stalled_server_costs_threshold_socket_timeouts_then_none(
    own_server: RedisServer, figures: Callable[..., None]
) -> None:
    layer = Stampede.from_url(own_server.url, socket_timeout=0.3, socket_connect_timeout=0.3,
                              breaker_threshold=3, breaker_cooldown=1.0)  # fmt: skip
    calls: list[int] = []
    load = layer.cached_loader("item:{key}")(lambda key: calls.append(key) or key)
    try:
        assert load(0) == 0  # connected before the stall
        own_server.pause()
        slow = [timed(lambda key=key: load(key)) for key in (1, 2, 3)]
        assert [value for value, _ in slow] == [1, 2, 3]
        assert all(elapsed >= 0.25 for _, elapsed in slow), slow  # each waited its socket timeout
        fast = [timed(lambda key=key: load(key)) for key in range(4, 24)]
        figures("Redis paused (SIGSTOP), socket timeout 0.3 s, 23 calls (breaker threshold 3)",
                worst=max(elapsed for _, elapsed in slow + fast), deadline=0.3 + 0.4,
                loads=len(calls) - 1, bound="1 per call (no cache)")  # fmt: skip
        assert [value for value, _ in fast] == list(range(4, 24))  # served by the loader (fail open)
        assert max(elapsed for _, elapsed in fast) < 0.1, fast

        strict = layer.cached_loader("strict:{key}", on_backend_error="raise")(lambda key: key)
        with pytest.raises(BackendUnavailable, match="circuit open"):
            strict(1)
        own_server.resume()
        time.sleep(1.0)  # the cool-down, as configured
        calls.clear()
        assert load(99) == 99  # the probe: answered, circuit closed, value cached
        assert load(99) == 99 and calls == [99]
    finally:
        own_server.resume()
        layer.close()


@pytest.mark.timing
def test_async_callers_share_the_layers_verdict(own_server: RedisServer) -> None:
    layer = Stampede.from_url(own_server.url, socket_timeout=0.3, socket_connect_timeout=0.3,
                              breaker_threshold=2, breaker_cooldown=30, on_backend_error="raise")  # fmt: skip

    @layer.cached_loader("sync:{key}")
    def blocking(key: int) -> int:
        return key

    @layer.cached_loader("async:{key}")
    async def awaited(key: int) -> int:
        return key

    async def refused() -> float:
        start = time.monotonic()
        with pytest.raises(BackendUnavailable, match="circuit open"):
            await awaited(1)
        await layer.aclose()
        return time.monotonic() - start

    try:
        own_server.stop()
        for key in (1, 2):
            with pytest.raises(BackendUnavailable):
                blocking(key)
        assert asyncio.run(refused()) < 0.1  # no connection attempt at all
    finally:
        layer.close()


def test_callers_who_only_waited_for_a_free_connection_leave_the_circuit_closed(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """Every connection of the pool in use (here held outright): callers beyond it wait
    the pool's timeout and are served without the cache, but the server was never asked,
    so the breaker counts none of them. Counted, they opened the circuit of a healthy
    server for its cool-down (a burst of 400 threads over 64 connections, in CI)."""
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=2, timeout=0.05)
    layer = Stampede(client=redis.Redis(connection_pool=pool), namespace="pool-wait",
                     breaker_threshold=2, breaker_cooldown=60)  # fmt: skip
    calls: list[int] = []
    load = layer.cached_loader("item:{key}")(lambda key: calls.append(key) or key)
    held = [pool.get_connection() for _ in range(2)]  # in use elsewhere in the process
    try:
        assert [load(key) for key in range(4)] == [0, 1, 2, 3]  # each after its wait, uncached
        assert calls == [0, 1, 2, 3]
    finally:
        for connection in held:
            pool.release(connection)
    try:
        calls.clear()
        assert load(9) == 9 and load(9) == 9  # the circuit closed: the second is a hit
        assert calls == [9]
    finally:
        layer.close()
        pool.disconnect()
