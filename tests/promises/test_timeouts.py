"""Loader timeouts over every backend, blocking and asyncio: ``load_timeout`` answers every
caller of a load that runs too long with ``LoadTimeout`` (or its stale value), never with a
second load, while the load goes on and writes when it ends (or, async, is cancelled);
``load_soft_timeout`` serves the stale value in hand. Across processes on one Redis
server at the end."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from stampede import Fetched, LoadTimeout, Stampede

from ..modes import Blocking, OnALoop
from ..scenarios import WaitsBegun, wait_until
from .test_controls import Versions, Worker, loader, subscribers


@pytest.fixture
def on_a_loop() -> Iterator[OnALoop]:
    """An event loop in a thread of its own (``mode``'s asyncio half)."""
    loop = OnALoop()
    try:
        yield loop
    finally:
        loop.close()


def test_every_caller_of_a_load_past_load_timeout_gets_load_timeout_and_the_load_writes_later(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    waits = WaitsBegun()
    layer = layer_of_each_backend(observers=[waits])
    db = Versions()
    db.release.clear()
    row = loader(layer, mode, db, load_timeout=0.3, cancel_on_timeout=False)
    calls = [mode.start(row, 1) for _ in range(3)]
    for call in calls:
        with pytest.raises(LoadTimeout, match="load_timeout=0.3"):
            call.result(10)
    with pytest.raises(LoadTimeout):  # the load still holds the lease: nobody loads again
        mode(row, 1)
    assert db.calls == {1: 1}
    assert mode(row.peek, 1) is None

    db.release.set()  # the load ends: it writes under its lease, which it kept renewed
    wait_until(lambda: mode(row.peek, 1) is not None, "the late load's write")
    assert mode(row, 1) == {"key": 1, "version": 1}
    assert db.calls == {1: 1}
    assert layer.stats()["load_timeouts"] == 2  # the leader's, shared by its joiners, and the last call's


def test_an_async_load_past_load_timeout_is_cancelled_and_holds_others_off(
    layer_of_each_backend: Callable[..., Stampede], on_a_loop: OnALoop
) -> None:
    layer = layer_of_each_backend()
    cancelled = threading.Event()

    async def hangs(key: int) -> int:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return key

    row = layer.cached_loader("row:{key}", load_timeout=0.3)(hangs)
    with pytest.raises(LoadTimeout, match="cancelled"):
        on_a_loop(row, 1)
    assert cancelled.wait(5)
    assert on_a_loop(row.peek, 1) is None
    stats = layer.stats()
    assert stats["load_timeouts"] == 1 and stats["loads"] == 1


def test_at_load_timeout_stale_if_error_serves_the_stale_value(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions()
    row = loader(layer, mode, db, ttl=0.2, stale_if_error=60, load_timeout=0.3, cancel_on_timeout=False)
    mode(row, 1)
    wait_until(lambda: mode(row.peek, 1).stale, "the value to pass its ttl")
    db.change_and_hold()

    assert mode(row, 1) == {"key": 1, "version": 1}  # the load outran load_timeout: stale
    db.release.set()
    wait_until(lambda: mode(row.peek, 1) == Fetched({"key": 1, "version": 2}, False), "the late write")
    assert db.calls == {1: 2}
    stats = layer.stats()
    assert stats["load_timeouts"] == 1 and stats["stale_on_error"] == 1


def test_a_late_load_that_raises_releases_its_lease(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    failing = {"now": True}

    def result(key: Any) -> Any:
        if failing["now"]:
            raise RuntimeError("the database went away")
        return {"key": key}

    db = Versions()
    db.result = result
    db.release.clear()
    row = loader(layer, mode, db, load_timeout=0.2, cancel_on_timeout=False)
    with pytest.raises(LoadTimeout):
        mode(row, 1)
    db.release.set()  # the late load raises: nobody to tell, its lease is released
    failing["now"] = False
    wait_until(lambda: _loads(mode, row) == {"key": 1}, "a new load once the lease is free")
    assert db.calls == {1: 2}
    assert layer.stats()["loader_errors"] == 1


def _loads(mode: Blocking | OnALoop, row: Any) -> Any:
    try:
        return mode(row, 1)
    except LoadTimeout:
        return None


@pytest.mark.timing
def test_a_soft_timeout_serves_the_stale_value_on_time_then_the_load_writes_once(
    make_layer: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = make_layer()
    db = Versions()
    row = loader(layer, mode, db, ttl=0.2, stale_if_error=60, load_soft_timeout=0.25, load_timeout=5)
    mode(row, 1)
    wait_until(lambda: mode(row.peek, 1).stale, "the value to pass its ttl")
    db.change_and_hold()

    started = time.monotonic()
    assert mode(row, 1) == {"key": 1, "version": 1}
    took = time.monotonic() - started
    assert 0.25 <= took < 0.25 + 0.1, took  # the soft timeout, plus a few ms (a shared machine: 100)
    db.release.set()
    wait_until(lambda: mode(row.peek, 1) == Fetched({"key": 1, "version": 2}, False), "the load's write")
    assert mode(row, 1) == {"key": 1, "version": 2}
    assert db.calls == {1: 2}  # written once, by the load that outlived its caller
    stats = layer.stats()
    assert stats["soft_timeouts"] == 1 and stats["load_timeouts"] == 0


def test_a_load_past_load_timeout_answers_its_waiters_in_three_processes_with_one_load(
    redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.set("version", 1)
    workers = [Worker(redis_url, "--load-timeout", "1") for _ in range(3)]
    loading, waiting = workers[0], workers[1:]
    try:
        loading.send("go")
        assert loading.line() == "loading"
        for worker in waiting:
            worker.send("go")
        wait_until(lambda: subscribers(redis_client, "controls:{product:1}") >= 2, "the waiters to subscribe")
        answers = [worker.outcome_line() for worker in workers]
        loading.send("release")  # the load ends after its callers gave up: it writes
        assert loading.outcome() == {"written": True}
    finally:
        for worker in workers:
            worker.stop()
    assert [answer["first"]["error"] for answer in answers] == ["LoadTimeout"] * 3
    assert all(answer["first"]["after"] < 1 + 0.5 for answer in answers)  # none waited past its bound by much
    assert int(redis_client.get("loads")) == 1
