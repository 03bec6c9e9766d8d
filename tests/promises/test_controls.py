"""The write and read controls over every backend, blocking and asyncio: ``set``
(write-through that overtakes a load in flight), ``peek``, ``refresh`` (one load, shared
with every refresh and miss), and ``Cached`` results (a value's own ttl, tags, and
``store=False``). Across processes on one Redis server at the end (``_core.controls``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from stampede import (
    NOT_MODIFIED,
    Cached,
    ConfigError,
    Fetched,
    SerializationError,
    Stampede,
    ValueTooLarge,
    previous,
)
from stampede._core.keys import EntryKeys
from stampede.testing import RedisServer, find_server_binary

from ..modes import Blocking, Database, OnALoop
from ..scenarios import LineWorker, WaitsBegun, wait_until

CONTROLS_WORKER = str(Path(__file__).parent.parent.joinpath("controls_worker.py"))


class Versions(Database):
    """A database of rows: each load returns the row's current version, or what
    ``answer`` makes of it (a ``Cached``)."""

    def __init__(self, answer: Callable[[Any, dict[str, Any]], Any] = lambda key, row: row) -> None:
        self.version = 1
        super().__init__(result=lambda key: answer(key, {"key": key, "version": self.version}))

    def change_and_hold(self) -> None:
        """The rows change to the next version, and the next load waits for ``release``."""
        self.started.clear()
        self.release.clear()
        self.version += 1


def loader(layer: Stampede, mode: Blocking | OnALoop, db: Database, **options: Any) -> Any:
    return layer.cached_loader("row:{key}", **options)(mode.loader(db))


def test_set_writes_through_and_no_call_loads_after_it(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions()
    row = loader(layer, mode, db)
    assert mode(row, 1)["version"] == 1

    assert mode(row.set, {"key": 1, "version": 2}, 1) is True
    assert mode(row, 1) == {"key": 1, "version": 2}
    assert mode(row.set, {"key": 2, "version": 7}, 2) is True  # an entry never loaded
    assert mode(row, 2) == {"key": 2, "version": 7}
    assert mode(row.set, None, 3) is True  # the null sentinel
    assert mode(row, 3) is None
    assert db.calls == {1: 1}
    assert layer.stats()["sets"] == 3


def test_set_overtakes_a_load_in_flight_which_is_not_written(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """aiocache#95's race: an older load finishing after the write-through must not write
    over it. Its caller gets what it loaded (its call began first). Everyone else,
    joiners of its flight included, gets the set value."""
    layer = layer_of_each_backend()
    db = Versions()
    db.release.clear()
    row = loader(layer, mode, db)
    in_flight = mode.start(row, 1)
    assert db.started.wait(5)
    joiner = mode.start(row, 1)
    db.version = 2  # the database changes; the application writes the cache through
    assert mode(row.set, {"key": 1, "version": 2}, 1) is True
    db.release.set()

    assert in_flight.result(10)["version"] == 1
    assert joiner.result(10)["version"] == 2
    assert mode(row, 1)["version"] == 2
    assert db.calls == {1: 1}
    stats = layer.stats()
    assert stats["sets"] == 1 and stats["stale_writes_prevented"] == 1


def test_a_set_is_one_round_trip_and_readers_never_find_the_entry_absent() -> None:
    """On one Redis server a set is one script: the invalidation and the write together. So a
    reader sees the old value, then the new, never the entry gone between them (as two
    round trips showed it, for one round trip's time), and never waits for a set. (A
    server of its own: its command counts are this test's alone.)"""
    if find_server_binary() is None:
        pytest.skip("no server binary to start a server of its own")
    with RedisServer() as server, Stampede.from_url(server.url, namespace="one") as layer:
        client = redis.Redis.from_url(server.url)
        row = layer.cached_loader("row:{key}")(lambda key: {"key": key, "version": 0})
        row(1)
        assert row.set({"key": 1, "version": 1}, 1) is True  # the script loaded once

        def calls(*names: str) -> int:
            stats = client.info("commandstats")
            return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in names)

        before, writes_before = calls("evalsha", "eval"), calls("set")
        for version in range(10):
            assert row.set({"key": 1, "version": version}, 1) is True
        assert calls("evalsha", "eval") - before == 10
        # With no load in flight the value is the one key a set writes: no lease is taken
        # and dropped inside the script (it was one more SET a set), and none is left.
        assert calls("set") - writes_before == 10
        assert not client.exists(EntryKeys.for_value(row.key(1)).lock)
        client.close()
        _readers_see_no_gap(layer, row)


def test_a_set_wakes_its_waiters_once_with_the_value(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    """The set's one script wakes the entry's waiters once, with the new value: not first
    with an empty message, which would send each of them to read the entry for nothing."""
    layer = make_layer(near_cache=False)
    row = layer.cached_loader("row:{key}")(lambda key: {"key": key, "version": 0})
    channel = EntryKeys.for_value(row.key(1)).channel
    pubsub = redis_client.pubsub()
    try:
        pubsub.subscribe(channel)
        assert pubsub.get_message(timeout=10)["type"] == "subscribe"
        assert row.set({"key": 1, "version": 1}, 1) is True
        redis_client.publish(channel, b"end")  # after every message of the set
        messages = []
        while not messages or messages[-1] != b"end":
            message = pubsub.get_message(timeout=10)
            assert message is not None, messages
            messages.append(message["data"])
        assert len(messages) == 2 and messages[0] == layer.store().get(row.key(1)), messages
    finally:
        pubsub.close()


def _readers_see_no_gap(layer: Stampede, row: Any) -> None:
    stop, absent, seen = threading.Event(), [], []

    def read() -> None:
        while not stop.is_set():
            found = row.peek(1)
            (absent if found is None else seen).append(found)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for version in range(10, 2010):
            assert row.set({"key": 1, "version": version}, 1) is True
    finally:
        stop.set()
        reader.join(10)
    assert not absent and len(seen) > 100, (len(absent), len(seen))
    versions = [found.value["version"] for found in seen]
    assert versions == sorted(versions)  # in the order the sets were made
    assert layer.stats()["loads"] == 1


def test_set_of_a_value_the_serializer_refuses_writes_nothing(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions()
    row = loader(layer, mode, db, max_value_bytes=100)
    mode(row, 1)

    with pytest.raises(SerializationError, match="not serializable"):
        mode(row.set, {"key": 1, "version": object()}, 1)
    with pytest.raises(ValueTooLarge):
        mode(row.set, {"key": 1, "version": "x" * 200}, 1)
    with pytest.raises(ValueError, match="store=False"):
        mode(row.set, Cached({"key": 1}, store=False), 1)
    assert mode(row.peek, 1) == Fetched({"key": 1, "version": 1}, False)  # the old value stands
    assert mode(row, 1)["version"] == 1
    assert db.calls == {1: 1}


def test_peek_answers_what_a_call_would_get_with_no_load_and_no_lease(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions()
    row = loader(layer, mode, db)
    assert mode(row.peek, 1) is None  # nothing cached
    assert mode(row.peek, 1) is None
    assert db.calls == {}

    mode(row, 1)
    assert mode(row.peek, 1) == Fetched({"key": 1, "version": 1}, False)
    mode(row.set, None, 2)
    assert mode(row.peek, 2) == Fetched(None, False)  # a cached None is not "nothing cached"
    assert db.calls == {1: 1}
    mode(row.invalidate, 1)
    assert mode(row.peek, 1) is None
    assert mode(row, 1)["version"] == 1  # no lease left behind by the peeks: this loads at once
    assert db.calls == {1: 2}


def test_peek_reports_a_value_past_its_ttl_as_stale_and_refreshes_nothing(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions()
    row = loader(layer, mode, db, ttl=0.2, stale_while_revalidate=30)
    mode(row, 1)
    wait_until(lambda: mode(row.peek, 1).stale, "the value to pass its ttl")
    assert mode(row.peek, 1) == Fetched({"key": 1, "version": 1}, True)
    assert db.calls == {1: 1}


def test_refresh_loads_now_while_readers_get_the_current_value(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions()
    row = loader(layer, mode, db)
    mode(row, 1)
    db.change_and_hold()
    refreshing = mode.start(row.refresh, 1)
    assert db.started.wait(5)
    assert mode(row, 1)["version"] == 1  # at once: the current value is still served
    db.release.set()

    assert refreshing.result(10)["version"] == 2
    assert mode(row, 1)["version"] == 2
    assert db.calls == {1: 2}
    assert layer.stats()["refresh_calls"] == 1


def test_refreshes_and_misses_at_one_moment_share_one_load(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """A refresh is a miss that will not take the current value: every refresh arriving
    while one loads, and every miss, gets that load's value."""
    waits = WaitsBegun()
    layer = layer_of_each_backend(observers=[waits])
    db = Versions()
    row = loader(layer, mode, db)
    mode(row, 1)
    db.change_and_hold()
    refreshes = [mode.start(row.refresh, 1) for _ in range(6)]
    miss = mode.start(row, 2)  # another entry: its own load
    assert db.started.wait(5)
    wait_until(lambda: waits.begun >= 5, "the other refreshes to wait for the one loading")
    db.release.set()

    assert {outcome.result(10)["version"] for outcome in refreshes} == {2}
    assert miss.result(10)["version"] == 2
    assert db.calls == {1: 2, 2: 1}


def test_a_cached_ttl_is_the_values_own(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions(answer=lambda key, row: Cached(row, ttl=0.3) if key == 1 else row)
    row = loader(layer, mode, db, ttl=60)
    assert mode(row, 1) == {"key": 1, "version": 1}  # callers get the value, not the Cached
    assert mode(row, 2) == {"key": 2, "version": 1}
    started = time.monotonic()
    wait_until(lambda: mode(row.peek, 1) is None, "the 0.3 s value to expire", timeout=10)
    assert time.monotonic() - started < 10
    assert mode(row.peek, 2) is not None  # the loader's ttl, 60 s
    assert mode(row, 1)["version"] == 1
    assert db.calls == {1: 2, 2: 1}
    with pytest.raises(ValueError, match="positive"):
        Cached(1, ttl=0)


def test_a_value_not_to_be_stored_goes_to_its_flight_and_is_not_kept(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """``Cached(store=False)``: every caller of the flight gets the value, one load. The
    next caller loads again, as one new flight: nobody queues behind lease after lease."""
    waits = WaitsBegun()
    layer = layer_of_each_backend(observers=[waits])
    db = Versions(answer=lambda key, row: Cached(row, store=False))
    db.release.clear()
    row = loader(layer, mode, db)
    calls = [mode.start(row, 1) for _ in range(5)]
    assert db.started.wait(5)
    wait_until(lambda: waits.begun >= 4, "the other callers to join the load")
    db.release.set()

    assert [call.result(10) for call in calls] == [{"key": 1, "version": 1}] * 5
    assert db.calls == {1: 1}
    wait_until(lambda: mode(row.peek, 1) is None, "nothing to be kept")
    db.version = 2
    assert mode(row, 1)["version"] == 2
    assert db.calls == {1: 2}
    assert layer.stats()["uncached_results"] == 2


def test_value_tags_join_the_entrys_and_are_invalidated_with_them(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions(answer=lambda key, row: Cached(row, tags=[f"supplier:{key % 2}"]))
    row = loader(layer, mode, db, tags=["row:{key}"])
    other = layer.cached_loader("other:{key}", tags=[])(
        mode.loader(Versions(answer=lambda key, row: Cached(row, tags=["supplier:1"])))
    )
    for key in (1, 2, 3):
        mode(row, key)
    mode(other, 1)

    assert layer.invalidate_tag("supplier:1") == 3  # rows 1 and 3, and the other loader's entry
    assert layer.invalidate_tag("row:2") == 1  # the declared tag is kept beside the value's
    for key in (1, 2, 3):
        mode(row, key)
    assert db.calls == {1: 2, 2: 2, 3: 2}


def test_value_tags_on_a_loader_declared_without_tags_are_refused_and_hold_nothing(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions(answer=lambda key, row: Cached(row, tags=["supplier:1"]))
    row = loader(layer, mode, db)
    for _ in range(2):  # the second loads at once: no lease was left held
        with pytest.raises(ConfigError, match="tags="):
            mode(row, 1)
    assert mode(row.peek, 1) is None
    assert db.calls == {1: 2}


def test_a_tagged_set_is_invalidated_with_its_tags(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions()
    row = loader(layer, mode, db, tags=["row:{key}"])
    assert mode(row.set, Cached({"key": 1, "version": 5}, tags=["supplier:9"]), 1) is True
    assert mode(row, 1)["version"] == 5
    assert layer.invalidate_tag("supplier:9") == 1
    assert mode(row, 1)["version"] == 1
    assert mode(row.set, {"key": 1, "version": 6}, 1) is True
    assert layer.invalidate_tag("row:1") == 1
    assert mode(row, 1)["version"] == 1
    assert db.calls == {1: 2}


def unchanged_unless_newer(db: Versions) -> Callable[[Any, dict[str, Any]], Any]:
    """An answer that keeps the value a load refreshes while the database's version is the
    one it holds: a conditional refresh."""

    def answer(key: Any, row: dict[str, Any]) -> Any:
        old = previous()
        if old is not None and old.value["version"] == db.version:
            return NOT_MODIFIED
        return row

    return answer


def test_a_background_refresh_that_answers_not_modified_keeps_the_value_fresh_again(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions()
    db.result = lambda key: unchanged_unless_newer(db)(key, {"key": key, "version": db.version})
    row = loader(layer, mode, db, ttl=0.3, stale_while_revalidate=30)
    assert mode(row, 1) == {"key": 1, "version": 1}
    wait_until(lambda: mode(row.peek, 1).stale, "the value to pass its ttl")
    assert mode(row, 1) == {"key": 1, "version": 1}  # stale: served, refreshed in the background
    wait_until(lambda: not mode(row.peek, 1).stale, "the refresh to keep it, fresh again")
    assert mode(row.peek, 1) == Fetched({"key": 1, "version": 1}, False)
    assert db.calls == {1: 2}
    assert layer.stats()["not_modified"] == 1


def test_refresh_hands_the_loader_the_value_and_a_not_modified_answer_returns_it(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions()
    seen: list[Any] = []

    def answer(key: Any, row: dict[str, Any]) -> Any:
        old = previous()
        seen.append(None if old is None else (old.value, old.loaded_at > 0))
        return unchanged_unless_newer(db)(key, row)

    db.result = lambda key: answer(key, {"key": key, "version": db.version})
    row = loader(layer, mode, db)
    mode(row, 1)
    assert mode(row.refresh, 1) == {"key": 1, "version": 1}  # kept
    db.version = 2
    assert mode(row.refresh, 1) == {"key": 1, "version": 2}  # changed: written
    assert mode(row, 1) == {"key": 1, "version": 2}
    assert seen == [None, ({"key": 1, "version": 1}, True), ({"key": 1, "version": 1}, True)]
    assert layer.stats()["not_modified"] == 1


def test_not_modified_with_a_ttl_of_its_own_keeps_the_value_for_that_long(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """``Cached(NOT_MODIFIED, ttl=...)``: the kept value's new expiry is the one given,
    not the loader's (60 s here): it is gone within it, with no load in between."""
    layer = layer_of_each_backend()
    db = Versions(answer=lambda key, row: Cached(NOT_MODIFIED, ttl=0.3) if previous() else row)
    row = loader(layer, mode, db, ttl=60)
    mode(row, 1)
    assert mode(row.refresh, 1) == {"key": 1, "version": 1}  # kept, not rewritten
    assert mode(row.peek, 1) == Fetched({"key": 1, "version": 1}, False)
    wait_until(lambda: mode(row.peek, 1) is None, "the kept value to end at its own ttl")
    assert db.calls == {1: 2}
    assert layer.stats()["not_modified"] == 1


def test_not_modified_from_a_load_that_refreshes_nothing_is_an_error_and_holds_nothing(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions(answer=lambda key, row: NOT_MODIFIED)
    row = loader(layer, mode, db)
    for _ in range(2):  # the second loads at once: no lease was left held
        with pytest.raises(ValueError, match="NOT_MODIFIED"):
            mode(row, 1)
    assert db.calls == {1: 2}


def test_a_tagged_value_kept_as_not_modified_is_written_again_under_its_tags(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Versions()

    def answer(key: Any) -> Any:
        kept = unchanged_unless_newer(db)(key, {"key": key, "version": db.version})
        return kept if kept is NOT_MODIFIED else Cached(kept, tags=[f"supplier:{key}"])

    db.result = answer
    row = loader(layer, mode, db, tags=["row:{key}"])
    mode(row, 1)
    assert mode(row.refresh, 1) == {"key": 1, "version": 1}  # kept: written again under both tags
    assert layer.invalidate_tag("row:1") == 1  # the declared tag
    assert mode(row, 1) == {"key": 1, "version": 1}
    assert mode(row.refresh, 1) == {"key": 1, "version": 1}
    assert layer.invalidate_tag("supplier:1") == 1  # and the value's own
    assert mode(row.peek, 1) is None
    assert db.calls == {1: 4}


# --- across processes, on one Redis server ----------------------------------------------


class Worker(LineWorker):
    """A ``controls_worker.py`` process, talking over its stdin and stdout."""

    def __init__(self, url: str, *options: str) -> None:
        super().__init__(CONTROLS_WORKER, "--url", url, *options)

    def outcome(self, timeout: float = 30.0) -> dict[str, Any]:
        out, _ = self.process.communicate(timeout=timeout)
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def subscribers(client: redis.Redis, key: str) -> int:
    return int(client.pubsub_numsub(EntryKeys.for_value(key).channel)[0][1])


def test_set_overtakes_a_load_in_another_process_and_its_waiters_get_the_set_value(
    make_layer: Callable[..., Stampede], redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.set("version", 1)
    loading, waiting = Worker(redis_url, "--then"), Worker(redis_url)
    try:
        loading.send("go")
        assert loading.line() == "loading"
        waiting.send("go")
        wait_until(lambda: subscribers(redis_client, "controls:{product:1}") >= 1, "the waiter to subscribe")
        redis_client.set("version", 2)
        layer = make_layer(namespace="controls")

        @layer.cached_loader("product:{product_id}")
        def product(product_id: int) -> Any:
            raise AssertionError("the set value is in the cache")

        assert product.set({"product": 1, "version": 2}, 1) is True
        assert waiting.outcome()["first"]["version"] == 2  # woken with the set value
        loading.send("release")
        seen = loading.outcome()
    finally:
        loading.stop()
        waiting.stop()
    assert seen["first"]["version"] == 1  # its own caller: its call began before the set
    assert seen["then"]["version"] == 2  # not written over the set value
    assert seen["stats"]["stale_writes_prevented"] == 1
    assert product(1) == {"product": 1, "version": 2}
    assert int(redis_client.get("loads")) == 1


def test_refresh_from_eight_processes_at_once_loads_once(
    make_layer: Callable[..., Stampede], redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.set("version", 1)
    layer = make_layer(namespace="controls")

    @layer.cached_loader("product:{product_id}")
    def product(product_id: int) -> Any:
        return {"product": product_id, "version": 1}

    product(1)
    redis_client.set("version", 2)
    workers = [Worker(redis_url, "--call", "refresh") for _ in range(8)]
    try:
        for worker in workers:
            worker.send("go")
        wait_until(lambda: redis_client.get("loads") is not None, "one worker to load", timeout=10)
        wait_until(lambda: subscribers(redis_client, "controls:{product:1}") >= 7, "7 to wait", timeout=10)
        assert product(1)["version"] == 1  # meanwhile readers get the current value
        for worker in workers:
            worker.send("release")  # only the one loading reads it
        seen = [worker.outcome() for worker in workers]
    finally:
        for worker in workers:
            worker.stop()
    assert [outcome["first"]["version"] for outcome in seen] == [2] * 8
    assert int(redis_client.get("loads")) == 1
    assert product(1)["version"] == 2


def test_a_value_not_to_be_stored_reaches_waiters_in_other_processes(
    make_layer: Callable[..., Stampede], redis_url: str, redis_client: redis.Redis
) -> None:
    redis_client.set("version", 1)
    loading, waiting = Worker(redis_url, "--pass-through"), Worker(redis_url, "--pass-through")
    try:
        loading.send("go")
        assert loading.line() == "loading"
        waiting.send("go")
        wait_until(lambda: subscribers(redis_client, "controls:{product:1}") >= 1, "the waiter to subscribe")
        loading.send("release")
        seen = [loading.outcome(), waiting.outcome()]
    finally:
        loading.stop()
        waiting.stop()
    assert [outcome["first"] for outcome in seen] == [{"product": 1, "version": 1}] * 2
    assert int(redis_client.get("loads")) == 1
    wait_until(lambda: redis_client.exists("controls:{product:1}") == 0, "nothing to be kept")
