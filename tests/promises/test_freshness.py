"""Freshness: stale-while-revalidate, stale-if-error, early refresh and expire(), over
every backend, blocking and asyncio, and across processes."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis

from stampede import ConfigError, Fetched, Stampede
from stampede._backends.memory.store import MemoryStore
from stampede._backends.redis import scripts
from stampede._core.codec import Codec
from stampede._core.config import Settings
from stampede._core.freshness import Served, Stale, classify
from stampede._core.keys import EntryKeys
from stampede._core.store import FAILED_HOLD

from ..modes import hammer
from ..promises.test_behaviour import CountingLoader
from ..promises.test_processes import Workers
from ..scenarios import wait_until


class Database:
    """A versioned row: loads return the version read when they start; it can fail, or
    block a load until released, and counts every load."""

    def __init__(self, delay: float = 0.0) -> None:
        self.version = 1
        self.failing = False
        self.delay = delay
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self._lock = threading.Lock()

    def __call__(self, key: Any) -> dict[str, Any]:
        with self._lock:
            self.calls += 1
            version, failing = self.version, self.failing
        self.started.set()
        assert self.release.wait(30), "the test never released the loader"
        if self.delay:
            time.sleep(self.delay)
        if failing:
            raise ConnectionError("the database is down")
        return {"key": key, "v": version}


def stale_now(layer: Stampede, key: str, window: float) -> None:
    """Wait, by the store's clock, until the value at ``key`` is past its ttl."""
    store = layer._runner.store  # type: ignore[union-attr]
    wait_until(lambda: store.get_with_ttl(key)[1] <= window, "the value to go stale", timeout=10)


def refreshed(layer: Stampede, count: int = 1) -> None:
    wait_until(lambda: layer.stats()["refreshes"] >= count and layer._runner.refresher.running() == 0,  # type: ignore[union-attr]
               "the background refresh to finish")  # fmt: skip


# --- the decision, without a store -------------------------------------------------------


def test_freshness_is_decided_by_the_stores_remaining_ttl_alone() -> None:
    codec = Codec()
    settings = Settings(ttl=60, stale_while_revalidate=10, stale_if_error=300)
    raw = codec.encode({"v": 1}, loaded_at=time.time() - 3600, load_duration=0.05, key="k", stale_for=300)
    never = lambda: 0.5  # noqa: E731  (no early refresh draw fires at these distances)
    # The writer's clock said an hour ago: only the remaining TTL counts.
    assert classify(raw, 300 + 1, codec, settings, never) == Served({"v": 1})
    assert classify(raw, 300 - 5, codec, settings, never) == Served({"v": 1}, stale=True, refresh=raw[:16])
    past = classify(raw, 300 - 50, codec, settings, never)
    assert isinstance(past, Stale) and past.on_error and past.value == {"v": 1}
    shorter = Settings(ttl=60, stale_while_revalidate=10)  # a reader with shorter windows
    assert classify(raw, 300 - 50, codec, shorter, never) == Stale({"v": 1}, raw[:16], on_error=False)
    assert classify(raw, -1, codec, settings, never) == Served({"v": 1})  # no expiry: fresh


def test_early_refresh_follows_xfetch() -> None:
    codec, settings = Codec(), Settings(early_refresh=1.0)
    raw = codec.encode("x", time.time(), load_duration=0.1, key="k")
    draw = 1 - math.exp(-2)  # -ln(1 - draw) == 2: a gap of delta * beta * 2 = 0.2 s
    assert classify(raw, 0.19, codec, settings, lambda: draw) == Served("x", refresh=raw[:16], early=True)
    assert classify(raw, 0.21, codec, settings, lambda: draw) == Served("x")


@pytest.mark.parametrize(
    "setting",
    [{"stale_while_revalidate": -1}, {"stale_if_error": math.nan}, {"stale_if_error": math.inf},
     {"early_refresh": -0.5}, {"early_refresh": math.inf}, {"stale_retry_interval": 0},
     {"stale_while_revalidate": True}],
)  # fmt: skip
def test_bad_freshness_settings_are_refused_when_given(setting: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Stampede(**setting)
    with pytest.raises(ConfigError):
        Stampede().cached_loader("x:{x}", **setting)


# --- stale while revalidate ------------------------------------------------------------------


@pytest.mark.timing
def test_threads_past_ttl_get_the_old_value_at_once_and_one_refresh_runs(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend(jitter=0)
    db = Database()
    load = layer.cached_loader("row:{key}", ttl=0.3, stale_while_revalidate=30)(db)
    assert load(1) == {"key": 1, "v": 1}
    db.version = 2
    stale_now(layer, load.key(1), 30)

    db.release.clear()  # the refresh blocks until every caller has returned: none waits for it
    results: list[Any] = []
    callers = threading.Thread(target=lambda: results.extend(hammer(load.fetch, [1] * 32)))
    callers.start()
    callers.join(10)
    assert not callers.is_alive(), "a caller waited for the refresh"
    assert {(r.value["v"], r.stale) for r in results} == {(1, True)} and len(results) == 32
    db.release.set()
    refreshed(layer)
    assert load.fetch(1).value == {"key": 1, "v": 2} and not load.fetch(1).stale
    assert db.calls == 2
    stats = layer.stats()
    assert stats["refreshes"] == 1 and stats["stale_hits"] >= 1 and stats["loads"] == 2


def test_five_hundred_coroutines_past_ttl_get_the_old_value_and_one_refresh_runs(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend(jitter=0)
    calls = {"n": 0}
    release = asyncio.Event  # made in the loop below

    async def run() -> None:
        gate = release()

        @layer.cached_loader("arow:{key}", ttl=0.3, stale_while_revalidate=30)
        async def load(key: int) -> dict[str, int]:
            calls["n"] += 1
            if calls["n"] > 1:
                await gate.wait()
            return {"key": key, "v": calls["n"]}

        assert await load(1) == {"key": 1, "v": 1}
        store = layer._async_runner.loop_store()  # type: ignore[union-attr]
        while (await store.get_with_ttl(load.key(1)))[1] > 30:
            await asyncio.sleep(0.02)
        results = await asyncio.gather(*(load.fetch(1) for _ in range(500)))
        assert {(r.value["v"], r.stale) for r in results} == {(1, True)}  # while the refresh is blocked
        for _ in range(500):
            if calls["n"] == 2:
                break
            await asyncio.sleep(0.01)
        assert calls["n"] == 2
        gate.set()
        for _ in range(200):
            if not (await load.fetch(1)).stale:
                break
            await asyncio.sleep(0.01)
        assert await load(1) == {"key": 1, "v": 2}
        await layer.aclose()

    asyncio.run(run())
    assert calls["n"] == 2 and layer.stats()["refreshes"] == 1


@pytest.mark.timing
def test_two_processes_past_ttl_get_the_old_value_at_once_and_refresh_once(
    redis_url: str, redis_client: redis.Redis
) -> None:
    options = ("--threads", "16", "--delay", "2.0", "--ttl", "0.3", "--stale-while-revalidate", "30")
    workers = Workers()
    try:
        first = workers.start(redis_url, *options)
        workers.expect(first, "ready")
        workers.go([first])  # loads v1
        assert workers.result(first)["versions"] == [1]
        wait_until(lambda: 0 <= redis_client.pttl("proc:{item:0}") <= 30_000, "the value to go stale")
        started = [workers.start(redis_url, *options) for _ in range(2)]
        for process in started:
            workers.expect(process, "ready")
        workers.go(started)
        results = [workers.result(process) for process in started]
    finally:
        workers.stop_all()
    for result in results:
        assert result["versions"] == [1] and result["stale"] == 16 and result["wrong"] == []
        assert result["max_latency"] < 1.5  # the refresh takes 2 s: nobody waited for it
    # Exactly one refresh across both processes (and it completed: each waited for its
    # own refresh thread only if it ran it; the other found the lease held).
    assert sum(result["stats"]["refreshes"] for result in results) == 1
    wait_until(lambda: redis_client.get("calls:0") == b"2", "the refresh to load")
    # The refreshed value is the second load's (its PTTL is no sign: past 30 s only for
    # the 0.3 s of its ttl, which a loaded machine let pass before this line once).
    wait_until(lambda: b'"v":2' in (redis_client.get("proc:{item:0}") or b""), "the refreshed value to be written")


def test_a_failing_refresh_keeps_serving_the_old_value_until_the_window_ends(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend(jitter=0)
    db = Database()
    load = layer.cached_loader("row:{key}", ttl=0.2, stale_while_revalidate=3.0, stale_retry_interval=0.25)(db)
    load(1)
    db.failing = True
    stale_now(layer, load.key(1), 3.0)
    served_for = time.monotonic()
    # Served for a second at least, and until two refreshes were tried (a loaded machine
    # can stretch one database round trip over much of that second).
    while (elapsed := time.monotonic() - served_for) < 1.0 or (db.calls - 1 < 2 and elapsed < 2.5):
        fetched = load.fetch(1)
        assert fetched.value == {"key": 1, "v": 1} and fetched.stale
        time.sleep(0.01)
    elapsed = time.monotonic() - served_for
    # One refresh per retry interval across the layer: at most elapsed / 0.25 (+1 at each edge).
    assert 2 <= db.calls - 1 <= elapsed / 0.25 + 2
    # A refresh may be under way: its loader called, its error not yet counted.
    wait_until(lambda: layer.stats()["refresh_errors"] == db.calls - 1, "every refresh's error counted", timeout=5)
    wait_until(lambda: layer._runner.store.get_with_ttl(load.key(1))[0] is None,  # type: ignore[union-attr]
               "the stale window to end", timeout=5)  # fmt: skip
    with pytest.raises(ConnectionError):
        load(1)  # past ttl + stale_while_revalidate the error reaches the caller


def test_a_process_killed_while_its_refresh_holds_the_lease_is_taken_over_after_the_lease(
    redis_url: str, redis_client: redis.Redis, make_layer: Callable[..., Stampede]
) -> None:
    layer = make_layer(namespace="proc", ttl=0.3, stale_while_revalidate=30, lock_ttl=1.0, jitter=0)
    versions = iter(range(1, 100))
    load = layer.cached_loader("item:{key}")(lambda key: {"key": key, "v": next(versions)})
    assert load(0)["v"] == 1
    wait_until(lambda: 0 <= redis_client.pttl("proc:{item:0}") <= 30_000, "the value to go stale")
    workers = Workers()
    try:
        holder = workers.start(redis_url, "--threads", "1", "--hang", "--ttl", "0.3", "--stale-while-revalidate", "30",
                               "--lock-ttl", "1.0")  # fmt: skip
        workers.expect(holder, "ready")
        workers.go([holder])
        assert holder.stdout is not None
        lines = {holder.stdout.readline().strip()[:9] for _ in range(2)}  # its result, and its refresh's start
        assert lines == {"loading", '{"calls":'}
        holder.kill()
        holder.wait(5)
        killed_at = time.monotonic()
        assert redis_client.get("proc:{item:0}:lock") is not None  # the dead refresh's lease
        while (fetched := load.fetch(0)).stale:
            assert fetched.value["v"] == 1 and time.monotonic() - killed_at < 3.0
            time.sleep(0.02)
    finally:
        workers.stop_all()
    assert fetched.value["v"] == 2  # our refresh, after the dead one's lease ran out
    assert time.monotonic() - killed_at < 1.0 + 1.0


# --- stale if error ---------------------------------------------------------------------------


@pytest.mark.timing
def test_stale_if_error_serves_the_old_value_while_the_loader_fails_and_retries_once_a_second(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend(jitter=0)
    other = layer if isinstance(layer._runner.store, MemoryStore) else layer_of_each_backend(jitter=0)  # type: ignore[union-attr]
    db = Database()
    options = dict(ttl=0.2, stale_if_error=30, stale_retry_interval=0.5)
    loads = [layer.cached_loader("row:{key}", **options)(db), other.cached_loader("row:{key}", **options)(db)]
    loads[0](1)
    db.failing, db.version = True, 2
    stale_now(layer, loads[0].key(1), 30)
    stop = threading.Event()
    seen: list[Any] = []
    served_by: list[Counter[Any]] = [Counter(), Counter()]  # what each layer's callers got

    def caller(side: int) -> None:
        while not stop.is_set():
            try:
                fetched = loads[side].fetch(1)
                seen.append((fetched.value["v"], fetched.stale))
                served_by[side][seen[-1]] += 1
            except Exception as error:  # collected: no caller may see one
                seen.append(error)
            time.sleep(0.005)

    # Two layers (two processes, as far as flights go), four threads each.
    threads = [threading.Thread(target=caller, args=(index % 2,)) for index in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(1.6)  # the outage
    attempts = db.calls - 1
    recovered_at = time.monotonic()
    db.failing = False
    wait_until(lambda: seen and seen[-1] == (2, False), "the new value after recovery", timeout=3)
    recovery = time.monotonic() - recovered_at
    stop.set()
    for thread in threads:
        thread.join(5)
    assert [outcome for outcome in seen if not isinstance(outcome, tuple)] == []
    assert set(seen) <= {(1, True), (2, False)}
    assert 2 <= attempts <= 5  # 1.6 s at one try per 0.5 s, across 8 threads in two layers
    assert recovery < 0.5 + 0.5  # the next try after the hold
    counts = [layer.stats(), other.stats()]
    assert counts[0]["stale_on_error"] > 0 and counts[1]["stale_on_error"] > 0, (served_by, counts)


def test_past_the_stale_if_error_window_the_error_reaches_the_caller(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend(jitter=0)
    db = Database()
    load = layer.cached_loader("row:{key}", ttl=0.2, stale_if_error=0.4, stale_retry_interval=0.05)(db)
    load(1)
    db.failing = True
    stale_now(layer, load.key(1), 0.4)
    assert load.fetch(1).stale
    wait_until(lambda: layer._runner.store.get_with_ttl(load.key(1))[0] is None,  # type: ignore[union-attr]
               "the stale window to end", timeout=5)  # fmt: skip
    with pytest.raises(ConnectionError):
        load(1)


def test_stale_if_error_does_not_keep_callers_from_a_healthy_load(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    """Past ttl with stale_if_error only, callers wait for the new value as they would
    without it: the old one is for when the load fails."""
    layer = layer_of_each_backend(jitter=0)
    db = Database(delay=0.1)
    load = layer.cached_loader("row:{key}", ttl=0.2, stale_if_error=30)(db)
    load(1)
    db.version = 2
    stale_now(layer, load.key(1), 30)
    results = hammer(load.fetch, [1] * 16)
    assert {(r.value["v"], r.stale) for r in results} == {(2, False)}
    assert db.calls == 2


# --- invalidate and expire ----------------------------------------------------------------------


def test_invalidate_in_another_process_beats_a_stale_value_and_a_running_refresh(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    reader_layer = layer_of_each_backend(jitter=0)
    # Another process, as far as flights go (an embedded layer's store is its own: there
    # the writer is the same layer).
    embedded = isinstance(reader_layer._runner.store, MemoryStore)  # type: ignore[union-attr]
    writer_layer = reader_layer if embedded else layer_of_each_backend(jitter=0)
    db = Database()
    options = dict(ttl=0.2, stale_while_revalidate=30, stale_if_error=30)
    read = reader_layer.cached_loader("row:{key}", **options)(db)
    write_side = writer_layer.cached_loader("row:{key}", **options)(db)
    read(1)
    stale_now(reader_layer, read.key(1), 30)
    db.release.clear()
    db.started.clear()
    assert read.fetch(1).stale  # and its refresh starts, reading version 1, then blocks
    assert db.started.wait(5)
    db.version = 2
    write_side.invalidate(1)
    db.release.set()  # the new load below must not be kept waiting
    for layer_load in (read, write_side):
        fetched = layer_load.fetch(1)
        assert fetched.value["v"] == 2 and not fetched.stale
    refreshed(reader_layer)
    assert reader_layer.stats()["stale_writes_prevented"] == 1  # the running refresh's v1
    assert read(1)["v"] == 2 and write_side(1)["v"] == 2


def test_expire_keeps_the_old_value_servable_as_stale_and_refreshes_it(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend(jitter=0)
    db = Database()
    load = layer.cached_loader("row:{key}", ttl=60, stale_while_revalidate=30)(db)
    load(1)
    db.version = 2
    load.expire(1)
    fetched = load.fetch(1)
    assert fetched.value["v"] == 1 and fetched.stale
    refreshed(layer)
    assert load.fetch(1).value["v"] == 2
    # Without a stale window, expire is invalidate.
    plain = layer.cached_loader("plain:{key}")(CountingLoader())
    plain(1)
    plain.expire(1)
    assert plain(1) == {"id": 1} and layer.stats()["loads"] == 4


def test_the_null_sentinel_is_served_stale_while_refreshed(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend(jitter=0)
    found = {"row": None}
    load = layer.cached_loader("maybe:{key}", null_ttl=0.2, stale_while_revalidate=30)(lambda key: found["row"])
    assert load(1) is None
    found["row"] = {"now": "there"}
    stale_now(layer, load.key(1), 30)
    fetched = load.fetch(1)
    assert fetched.value is None and fetched.stale
    refreshed(layer)
    assert load(1) == {"now": "there"}


# --- early refresh --------------------------------------------------------------------------------


@pytest.mark.timing
def test_early_refresh_keeps_a_hot_key_loaded_without_a_caller_waiting(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend()
    # XFetch starts a refresh about delta * ln(hits per second * delta) before expiry:
    # with a 100 ms load and ~800 hits a second, some 440 ms, which leaves the refresh
    # 340 ms to end before the value expires (with 50 ms, 130 ms: one stall of the
    # machine was enough for a caller to miss).
    db = Database(delay=0.1)
    ttl = 1.0
    load = layer.cached_loader("hot:{key}", ttl=ttl, early_refresh=1.0)(db)
    load(1)  # the warm-up: the only load a caller waits for
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            load(1)
            time.sleep(0.005)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(2.5)
    stop.set()
    for thread in threads:
        thread.join(5)
    refreshed(layer)
    stats = layer.stats()
    # No call after the warm-up waited for a load: none missed, none found it stale or
    # waited for another's lease; every load was a background refresh.
    assert stats["misses"] == 1 and stats["stale_hits"] == 0 and stats["lock_waits"] == 0
    # Refreshed about once per ttl, a little early (some 440 ms; more when a stall of the
    # machine makes the load's measured time longer): at most three a ttl, never a storm.
    assert 3 <= db.calls <= 2.5 / ttl * 3 + 1
    assert stats["early_refreshes"] >= 2 and stats["refreshes"] == db.calls - 1


def test_a_full_refresh_pool_skips_and_counts(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(jitter=0, background_refreshes=1)
    db = Database()
    load = layer.cached_loader("row:{key}", ttl=0.2, stale_while_revalidate=30)(db)
    load(1), load(2)
    stale_now(layer, load.key(1), 30)
    stale_now(layer, load.key(2), 30)
    db.release.clear()
    assert load.fetch(1).stale  # its refresh takes the only slot, and blocks
    assert load.fetch(2).stale  # no slot: skipped, not queued
    assert layer.stats()["refreshes_skipped"] == 1
    db.release.set()
    refreshed(layer)
    assert db.calls == 3


def test_async_callers_get_the_old_value_while_the_loader_fails_and_after_expire(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend(jitter=0)
    state = {"failing": False, "version": 1, "calls": 0}

    @layer.cached_loader("arow:{key}", ttl=0.2, stale_if_error=30, stale_while_revalidate=0.1,
                         stale_retry_interval=0.5)  # fmt: skip
    async def load(key: int) -> dict[str, Any]:
        state["calls"] += 1
        if state["failing"]:
            raise ConnectionError("the database is down")
        return {"key": key, "v": state["version"]}

    async def run() -> None:
        assert (await load(1))["v"] == 1
        state["failing"], state["version"] = True, 2
        store = layer._async_runner.loop_store()  # type: ignore[union-attr]
        while (await store.get_with_ttl(load.key(1)))[1] > 30 - 0.1:  # past the swr window too
            await asyncio.sleep(0.02)
        before = state["calls"]
        for _ in range(3):
            results = await asyncio.gather(*(load.fetch(1) for _ in range(200)))
            assert {(r.value["v"], r.stale) for r in results} == {(1, True)}
            await asyncio.sleep(0.1)
        assert 1 <= state["calls"] - before <= 2  # one try per 0.5 s, for 600 callers
        state["failing"] = False  # the next try, in the background after the hold, succeeds
        for _ in range(300):
            fetched = await load.fetch(1)
            if not fetched.stale:
                break
            await asyncio.sleep(0.01)
        assert fetched == Fetched({"key": 1, "v": 2}, False)
        state["version"] = 3
        await load.expire(1)
        assert await load.fetch(1) == Fetched({"key": 1, "v": 2}, True)  # served while refreshed
        await layer.aclose()

    asyncio.run(run())


def test_the_failed_hold_marker_is_the_one_the_scripts_spell_out() -> None:
    assert f"'{FAILED_HOLD}'" in scripts.ACQUIRE and f"'{FAILED_HOLD}'" in scripts.HOLD_AFTER_FAILURE


def test_a_writer_whose_clock_is_minutes_off_changes_nothing(
    make_layer: Callable[..., Stampede], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The envelope's loaded_at is the writer's wall clock; freshness is decided by the
    server's TTL alone, so a writer ten minutes ahead (or behind) is served on time."""
    from stampede._drivers import drive as blocking  # where the runner makes a miss's context

    made = blocking.new_context
    for skew in (600.0, -600.0):

        def skewed(*args: Any, skew: float = skew) -> Any:
            ctx = made(*args)
            ctx.wall_clock = lambda: time.time() + skew
            return ctx

        monkeypatch.setattr(blocking, "new_context", skewed)
        writer = make_layer(jitter=0)
        db = Database()
        # ttl 3 s: fresh when read on a busy machine (0.5 s was not); stale_now waits it out
        load = writer.cached_loader(f"skew{int(skew)}:{{key}}", ttl=3, stale_while_revalidate=30)(db)
        load(1)
        monkeypatch.undo()
        reader = make_layer(jitter=0).cached_loader(f"skew{int(skew)}:{{key}}", ttl=3, stale_while_revalidate=30)(db)
        assert reader.fetch(1) == Fetched({"key": 1, "v": 1}, False)  # fresh, though "loaded" minutes away
        db.version = 2
        stale_now(writer, load.key(1), 30)
        assert reader.fetch(1) == Fetched({"key": 1, "v": 1}, True)  # stale right after ttl, by the server


def test_a_get_and_a_pttl_sent_together_read_a_key_deleted_between_them_as_absent() -> None:
    from stampede._backends.redis.replies import asks_failing, marked, with_ttl
    from stampede._core.codec import Codec

    assert with_ttl(b"value", -2) == (None, 0.0, False)  # an invalidation ran between the two
    assert with_ttl(None, 1500) == (None, 0.0, False)
    assert with_ttl(b"value", -1) == (b"value", -1.0, False)  # no expiry: fresh
    assert marked(with_ttl(b"value", 1500), 1) == (b"value", 1.5, True)
    stale = Codec().encode(1, 1.0, 0.0, key="k", stale_for=30.0)
    assert asks_failing(with_ttl(stale, 20_000), True)  # past its ttl: the marker is read
    assert not asks_failing(with_ttl(stale, 40_000), True)  # fresh: two commands, not three
    assert not asks_failing(with_ttl(stale, 20_000), False)


def test_the_refresh_workers_are_bounded_reused_and_leave_when_idle(caplog: pytest.LogCaptureFixture) -> None:
    from stampede._drivers.observe import Events, RateLimitedLog
    from stampede._drivers.refresh import Refresher

    warn = RateLimitedLog(logging.getLogger("stampede"))
    stats = Events("test", warn)
    refresher = Refresher(2, stats, warn, idle_timeout=0.3)
    gate, ran = threading.Event(), []

    def work(name: str) -> Callable[[], None]:
        def run() -> None:
            assert gate.wait(10)
            ran.append(name)

        return run

    others = {thread for thread in threading.enumerate() if thread.name == "stampede-refresh"}

    def workers() -> int:  # this refresher's
        return sum(thread.name == "stampede-refresh" and thread not in others for thread in threading.enumerate())

    assert refresher.start("a", work("a")) and refresher.start("b", work("b"))
    assert not refresher.start("a", work("a again"))  # already under way: collapsed, not counted
    assert not refresher.start("c", work("c"))  # the limit: skipped, never queued
    assert stats.counts.snapshot()["refreshes_skipped"] == 1 and workers() == 2
    gate.set()
    wait_until(lambda: refresher.running() == 0, "the refreshes to finish")
    assert sorted(ran) == ["a", "b"]
    broken = lambda: 1 / 0  # noqa: E731
    assert refresher.start("d", broken) and refresher.start("e", work("e"))  # the same two workers
    wait_until(lambda: refresher.running() == 0, "the refreshes to finish")
    assert workers() == 2 and ran[-1] == "e"
    assert "the background refresh of 'd' raised ZeroDivisionError" in caplog.text  # logged, not raised
    wait_until(lambda: workers() == 0, "the idle workers to leave", timeout=5)
    assert refresher.start("f", work("f"))
    wait_until(lambda: refresher.running() == 0 and workers() == 1, "a new worker's refresh")
    refresher.close(timeout=1.0)
    wait_until(lambda: workers() == 0, "close() to let the idle worker leave")
    assert not refresher.start("g", work("g"))


@pytest.mark.timing
def test_while_the_loader_fails_past_the_revalidate_window_nobody_waits_for_a_retry(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    """Within stale_if_error only, the first failure is a caller's to wait for; it marks the
    entry failing, and from then on the retries run in the background, as under
    stale_while_revalidate: a database that takes seconds to fail holds up no caller."""
    layer = layer_of_each_backend(jitter=0)
    db = Database()
    load = layer.cached_loader("row:{key}", ttl=0.2, stale_if_error=30, stale_retry_interval=0.2)(db)
    load(1)
    db.failing, db.version = True, 2
    stale_now(layer, load.key(1), 30)
    assert load.fetch(1) == Fetched({"key": 1, "v": 1}, True)  # its own load failed
    db.release.clear()  # from now on a try blocks until released
    db.started.clear()
    store = layer._runner.store  # type: ignore[union-attr]
    wait_until(lambda: store.holder(EntryKeys.for_value(load.key(1))) is None, "the hold to end")
    results: list[Any] = []
    callers = threading.Thread(target=lambda: results.extend(hammer(load.fetch, [1] * 16)))
    callers.start()
    callers.join(10)
    assert not callers.is_alive(), "a caller waited for the retry"
    assert {(r.value["v"], r.stale) for r in results} == {(1, True)} and len(results) == 16
    assert db.started.wait(5)
    assert db.calls == 3  # the first load, the failed one, and the retry, in the background
    db.failing = False
    db.release.set()  # the retry fails (it read failing=True); the next one succeeds
    deadline = time.monotonic() + 5
    while (fetched := load.fetch(1)).stale:
        assert time.monotonic() < deadline, "the loader recovered but the value was never refreshed"
        time.sleep(0.02)
    assert fetched.value == {"key": 1, "v": 2} and layer.stats()["stale_on_error"] >= 2
