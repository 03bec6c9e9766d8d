"""A warm start (``hot_sample``, ``Stampede.warm``, docs/budgets.md): sampled calls make a
hot set in the store, hottest first, bounded and decaying; a warm start calls the hot set's
calls the cache does not hold, each key loaded once across every process warming at once,
within the load budget, with progress told; what is cached is not called."""

from __future__ import annotations

import asyncio
import decimal
import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio

from stampede import BackendUnavailable, ConfigError, Fetched, Stampede, WarmReport
from stampede._core.hotset import Countdown, HotSet, decode_call, encode_call, ranked
from stampede._warming import hot_calls, tiered

from ..modes import Blocking, Database, OnALoop

pytestmark = pytest.mark.timeout(60)


def warm(layer: Stampede, mode: Blocking | OnALoop, *loaders: Any, **options: Any) -> WarmReport:
    if isinstance(mode, Blocking):
        return layer.warm(*loaders, **options)
    return mode(lambda: layer.awarm(*loaders, **options))  # type: ignore[no-any-return]


def recorded(layer: Stampede, load: Any, count: int = 100) -> list[Any]:
    """The hot set's calls, hottest first, once the layer's samples are in the store."""
    layer.flush_hot_sets()
    return [args for args, _ in hot_calls(layer.store(), load.hot_set, count, time.time())]


def boot_together(pods: list[Stampede], loaders: list[Any], concurrency: int) -> list[WarmReport]:
    """Each pod warms its loader at the same moment (pods booting together), in a thread
    of its own: what each warm start reported."""
    barrier = threading.Barrier(len(pods))
    reports = [WarmReport() for _ in pods]

    def boot(index: int) -> None:
        barrier.wait(10)
        reports[index] = pods[index].warm(loaders[index], concurrency=concurrency)

    threads = [threading.Thread(target=boot, args=(index,)) for index in range(len(pods))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return reports


def test_sampled_calls_make_a_hot_set_hottest_first(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend(namespace=f"hot-{uuid.uuid4().hex[:8]}")
    db = Database(lambda key: {"id": str(key)})
    load = layer.cached_loader("item:{key}", hot_sample=1.0)(mode.loader(db))
    for key, times in (("b", 3), ("a", 5), ("c", 1)):
        for _ in range(times):
            mode(load, key)
    mode(load, decimal.Decimal("1.5"))  # a key, but not plain JSON: not recorded
    assert recorded(layer, load) == [("a",), ("b",), ("c",)]
    assert db.calls["a"] == 1  # hits are sampled too: the calls made, not the loads
    unsampled = layer.cached_loader("other:{key}")(mode.loader(db))
    mode(unsampled, "x")
    assert recorded(layer, unsampled) == []


def test_a_warm_start_loads_the_hot_calls_the_cache_lacks_once_and_tells_its_progress(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend(namespace=f"hot-{uuid.uuid4().hex[:8]}")
    db = Database()
    load = layer.cached_loader("item:{key}", hot_sample=1.0)(mode.loader(db))
    for key in range(20):
        mode(load, key)
    for key in range(15):  # cold again: what a restart or a new version leaves
        mode(load.invalidate, key)
    assert len(recorded(layer, load)) == 20
    seen: list[int] = []
    report = warm(layer, mode, load, concurrency=4, on_progress=lambda report: seen.append(report.done))
    assert (report.calls, report.cached, report.loaded, report.failed) == (20, 5, 15, 0), report
    assert sorted(seen) == list(range(1, 21))
    assert db.calls == {key: 2 if key < 15 else 1 for key in range(20)}
    assert [mode(load, key) for key in range(20)] == [{"id": key} for key in range(20)]
    assert db.total == 35  # all cached: no load after the warm start
    assert layer.stats()["warm_loaded"] == 15 and layer.stats()["warm_cached"] == 5
    layer.flush_hot_sets()
    assert recorded(layer, load)[:1] != [] and layer.stats().get("hot_set_errors", 0) == 0


def test_a_failing_call_is_counted_and_kept_and_the_rest_are_warmed(mode: Blocking | OnALoop) -> None:
    layer = Stampede.from_url("memory://", namespace="failing")
    try:

        def row(key: int) -> Any:
            if key == 3:
                raise LookupError("row 3 is gone")
            return {"id": key}

        db = Database(row)
        load = layer.cached_loader("item:{key}", hot_sample=1.0, on_wait_timeout="raise")(mode.loader(db))
        for key in range(6):
            try:
                mode(load, key)
            except LookupError:
                pass
        for key in range(6):
            mode(load.invalidate, key)
        recorded(layer, load)
        report = warm(layer, mode, load)
        assert (report.loaded, report.failed) == (5, 1)
        assert [type(error) for error in report.errors] == [LookupError]
    finally:
        layer.close()


def test_processes_warming_together_load_each_key_once_within_the_budget(
    layer_of_each_backend: Callable[..., Stampede], request: pytest.FixtureRequest
) -> None:
    """Two layers over one store stand for two pods booting together: each warms the whole
    hot set, each key is loaded once, and no more loads run at once than the budget."""
    if request.node.callspec.params["layer_of_each_backend"] == "embedded":
        pytest.skip("two embedded layers share no store")
    namespace = f"hot-{uuid.uuid4().hex[:8]}"
    running, peak, lock = [0], [0], threading.Lock()

    def row(key: int) -> Any:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.005)
        with lock:
            running[0] -= 1
        return {"id": key}

    pods = [layer_of_each_backend(namespace=namespace) for _ in range(2)]
    dbs = [Database(row) for _ in pods]
    loads = [
        pod.cached_loader("item:{key}", hot_sample=1.0, max_concurrent_loads=2)(db.load)
        for pod, db in zip(pods, dbs, strict=True)
    ]
    for key in range(40):
        loads[0](key)
    for key in range(40):
        loads[0].invalidate(key)
    assert len(recorded(pods[0], loads[0])) == 40
    peak[0] = 0
    reports = boot_together(pods, loads, concurrency=4)
    assert all(report.calls == 40 and report.failed == 0 for report in reports), reports
    warmed = [dbs[0].calls.get(key, 0) + dbs[1].calls.get(key, 0) for key in range(40)]
    assert warmed == [2] * 40  # the first call, then one load of the warm start between both pods
    assert peak[0] <= 2


def test_hot_sets_rank_by_this_period_and_half_the_last_and_sample_at_their_rate() -> None:
    hot = HotSet.of("ns", "item:{key}", 100, 60.0, 200)
    assert hot.key(125.0) == "ns:{~hot:item%3A%7Bkey%7D}:2" and hot.key(125.0, 1).endswith("}:1")
    assert hot.ttl_ms == 121_000
    assert ranked([(b"a", 3.0), (b"b", 1.0)], [(b"b", 5.0), (b"c", 8.0)], 10) == [b"c", b"b", b"a"]
    assert ranked([(b"a", 2.0)], [(b"b", 4.0)], 1) == [b"a"]  # a tie, by member
    assert decode_call(encode_call((1, "x"), {"b": [2]}) or b"") == ((1, "x"), {"b": [2]})
    assert encode_call((object(),), {}) is None
    with pytest.raises(ValueError, match="not a recorded call"):
        decode_call(b"{}")
    countdown = Countdown(0.1, random.Random(7))
    draws = [countdown.next() for _ in range(20_000)]
    assert 8.5 < sum(draws) / len(draws) < 9.5  # about nine calls pass between two recorded
    assert Countdown(1.0).next() == 0
    shuffled = tiered(list(range(10)), 4, random.Random(1))
    assert [sorted(shuffled[:4]), sorted(shuffled[4:8]), sorted(shuffled[8:])] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_bad_warm_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="hot_sample must be a fraction"):
        Stampede.from_url("memory://", hot_sample=2)
    with pytest.raises(ConfigError, match="hot_limit"):
        Stampede.from_url("memory://", hot_limit=0)
    layer = Stampede.from_url("memory://", namespace="refused")
    try:
        load = layer.cached_loader("item:{key}")(lambda key: key)
        with pytest.raises(ConfigError, match="concurrency"):
            layer.warm(load, concurrency=0)
        with pytest.raises(ConfigError, match="takes loaders of cached_loader"):
            layer.warm(lambda key: key)
        report = layer.warm(load)  # an empty hot set: nothing to do
        assert (report.calls, report.done) == (0, 0)
    finally:
        layer.close()


def test_a_loader_of_the_other_kind_is_refused_before_anything_is_warmed(redis_url: str) -> None:
    """``warm`` given an ``async def`` loader took its unawaited ``peek`` for a cached
    value (5 calls: cached 5, loaded 0, a fleet told it was warm); ``awarm`` given a
    blocking one counted every call failed. Both are refused up front, naming the method."""
    layer = Stampede.from_url(redis_url, namespace=f"kinds-{uuid.uuid4().hex[:8]}", hot_sample=1.0)
    loaded: list[str] = []

    async def fetch_async(key: str) -> str:
        loaded.append(key)
        return key

    def fetch(key: str) -> str:
        loaded.append(key)
        return key

    coroutines = layer.cached_loader("async:{key}")(fetch_async)
    blocking = layer.cached_loader("blocking:{key}")(fetch)
    try:
        for key in "abcde":
            blocking(key)
            asyncio.run(coroutines(key))
        layer.flush_hot_sets()
        asyncio.run(layer.aclose())  # the asyncio client of the first loop, closed with it
        asyncio.run(coroutines.invalidate("a"))
        blocking.invalidate("a")
        asyncio.run(layer.aclose())
        loaded.clear()
        with pytest.raises(ConfigError, match=r"warm\(\) was given .*async def loader: warm it with await awarm\(\)"):
            layer.warm(blocking, coroutines)
        with pytest.raises(ConfigError, match=r"awarm\(\) was given .*blocking loader: warm it with warm\(\)"):
            asyncio.run(layer.awarm(coroutines, blocking))
        assert loaded == []  # refused before any call
        assert layer.warm(blocking).loaded == 1  # the right kind warms what the cache lacks

        async def warm_async() -> WarmReport:
            try:
                return await layer.awarm(coroutines)
            finally:
                await layer.aclose()

        assert asyncio.run(warm_async()).loaded == 1
        assert sorted(loaded) == ["a", "a"]
    finally:
        layer.close()


def test_a_store_that_fails_to_record_loses_that_sample_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """The recorder's thread never ends with an exception: a failed batch is counted and
    warned about, and the next one is recorded."""
    layer = Stampede.from_url("memory://", namespace="failing-store")
    try:
        load = layer.cached_loader("item:{key}", hot_sample=1.0)(lambda key: {"id": key})
        store = layer.store()
        working = store.note_hot

        def refuse(*args: Any) -> None:
            raise BackendUnavailable("the store is away")

        store.note_hot = refuse  # type: ignore[method-assign]
        load(1)
        assert layer.flush_hot_sets() == 0 and layer.stats()["hot_set_errors"] == 1
        assert "recording a hot set failed (BackendUnavailable: the store is away)" in caplog.text
        store.note_hot = working  # type: ignore[method-assign]
        load(2)
        assert layer.flush_hot_sets() == 1 and recorded(layer, load) == [(2,)]
    finally:
        layer.close()


def test_a_flush_returns_once_a_flush_under_way_in_the_layers_thread_has_written(redis_url: str) -> None:
    """The layer's thread takes the counts, then writes them: a flush asked for meanwhile
    found nothing to take and returned before that write, and a warm start right after
    read an empty hot set (0 of 40 calls, once in a loaded suite run)."""
    layer = Stampede.from_url(redis_url, namespace=f"flush-{uuid.uuid4().hex[:8]}")
    try:
        load = layer.cached_loader("item:{key}", hot_sample=1.0)(lambda key: {"id": key})
        store = layer.store()
        writing, write = threading.Event(), threading.Event()
        working = store.note_hot

        def held(*args: Any) -> None:  # the store's own write, once the test lets it go
            writing.set()
            assert write.wait(10)
            working(*args)

        store.note_hot = held  # type: ignore[method-assign]
        load(1)
        assert writing.wait(10)  # the layer's thread has taken the count, and is writing it
        flushed = threading.Thread(target=layer.flush_hot_sets)
        flushed.start()
        flushed.join(0.2)
        assert flushed.is_alive()  # waits for the write under way
        write.set()
        flushed.join(10)
        assert not flushed.is_alive()
        store.note_hot = working  # type: ignore[method-assign]
        assert recorded(layer, load) == [(1,)]
    finally:
        layer.close()


class Shops:
    """A database of prices per shop, answering many ids per query: records each query."""

    def __init__(self) -> None:
        self.queries: list[tuple[str, list[int]]] = []
        self._lock = threading.Lock()

    def read(self, shop: str, ids: list[int]) -> dict[int, Any]:
        with self._lock:
            self.queries.append((shop, list(ids)))
        return {id_: {"shop": shop, "id": id_} for id_ in ids}

    def loader(self, mode: Blocking | OnALoop) -> Callable[..., Any]:
        if isinstance(mode, Blocking):
            return lambda shop, ids: self.read(shop, ids)

        async def prices(shop: str, ids: list[int]) -> dict[int, Any]:
            return self.read(shop, ids)

        return prices

    def one_loader(self, mode: Blocking | OnALoop) -> Callable[..., Any]:
        """A one-key loader of the same entries."""
        if isinstance(mode, Blocking):
            return lambda shop, id: self.read(shop, [id])[id]

        async def price(shop: str, id: int) -> Any:
            return self.read(shop, [id])[id]

        return price

    def loads(self) -> Counter[tuple[str, int]]:
        return Counter((shop, id_) for shop, ids in self.queries for id_ in ids)


def test_a_many_key_loaders_hottest_ids_are_warmed_in_pages_of_max_batch(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """Each id of a sampled page is a call of its own in the hot set; a warm start gathers
    the hottest ids of each shop into pages of ``max_batch``, peeks at each page, and loads
    only the ids the cache lacks, in one query per page."""
    layer = layer_of_each_backend(namespace=f"hot-{uuid.uuid4().hex[:8]}")
    shops = Shops()
    prices = layer.cached_loader_many("price:{shop}:{id}", batch="ids", hot_sample=1.0, max_batch=8)(shops.loader(mode))
    for _ in range(3):  # ids 0-9 of shop "a" are read three times, 10-19 once
        mode(prices, "a", list(range(10)))
    mode(prices, "a", list(range(10, 20)))
    mode(prices, "b", [1, 2, 3])
    hottest = recorded(layer, prices)
    assert sorted(hottest[:10]) == [("a", [id_]) for id_ in range(10)]
    assert sorted(hottest[10:]) == sorted(
        [("a", [id_]) for id_ in range(10, 20)] + [("b", [1]), ("b", [2]), ("b", [3])]
    )
    mode(prices.invalidate, "a", list(range(0, 20, 2)))  # ten of shop "a" cold again
    mode(prices.invalidate, "b", [2])
    shops.queries.clear()
    report = warm(layer, mode, prices, concurrency=2)
    assert (report.calls, report.cached, report.loaded, report.failed) == (23, 12, 11, 0), report
    assert shops.loads() == Counter([("a", id_) for id_ in range(0, 20, 2)] + [("b", 2)])  # each once
    assert all(len(ids) <= 8 and len(set(ids)) == len(ids) for _, ids in shops.queries), shops.queries
    assert len(shops.queries) == 4  # pages of eight (a: 8, 8, 4; b: 3), each asking only what it lacks
    assert layer.stats()["warm_loaded"] == 11 and layer.stats()["warm_cached"] == 12
    shops.queries.clear()
    assert mode(prices, "a", list(range(20))) == {id_: {"shop": "a", "id": id_} for id_ in range(20)}
    assert mode(prices, "b", [1, 2, 3]) == {id_: {"shop": "b", "id": id_} for id_ in (1, 2, 3)}
    assert shops.queries == []  # all warm


def test_processes_warming_a_many_key_loader_together_load_each_id_once(
    layer_of_each_backend: Callable[..., Stampede], request: pytest.FixtureRequest
) -> None:
    """Two layers over one store stand for two pods booting together: each warms the
    whole hot set of a many-key loader, in pages of eight; each id is loaded once
    between both, and no page asks for an id twice."""
    if request.node.callspec.params["layer_of_each_backend"] == "embedded":
        pytest.skip("two embedded layers share no store")
    namespace = f"hot-{uuid.uuid4().hex[:8]}"
    pods = [layer_of_each_backend(namespace=namespace) for _ in range(2)]
    shops = [Shops() for _ in pods]
    prices = [
        pod.cached_loader_many("price:{shop}:{id}", batch="ids", hot_sample=1.0, max_batch=8)(shop.loader(Blocking()))
        for pod, shop in zip(pods, shops, strict=True)
    ]
    for start in range(0, 48, 6):
        prices[0]("a", list(range(start, start + 6)))
    prices[0].invalidate("a", list(range(48)))
    assert len(recorded(pods[0], prices[0])) == 48
    shops[0].queries.clear()
    reports = boot_together(pods, prices, concurrency=3)
    assert all(report.calls == 48 and report.failed == 0 for report in reports), reports
    loads = shops[0].loads() + shops[1].loads()
    assert loads == Counter(("a", id_) for id_ in range(48))  # each id once, between both pods
    assert all(len(ids) <= 8 for shop in shops for _, ids in shop.queries)


def test_a_many_key_peek_tells_each_id_without_loading_and_its_hot_set_is_its_own(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """``peek`` of a many-key loader answers each id as a one-key ``peek`` would. A
    one-key loader of the same template keeps a hot set of its own: its calls take an id
    where the many-key loader's take a list, so neither warms from the other's calls."""
    layer = layer_of_each_backend(namespace=f"hot-{uuid.uuid4().hex[:8]}")
    shops = Shops()
    prices = layer.cached_loader_many("price:{shop}:{id}", batch="ids", hot_sample=1.0)(shops.loader(mode))
    price = layer.cached_loader("price:{shop}:{id}", hot_sample=1.0)(shops.one_loader(mode))
    mode(prices, "a", [1, 2])
    found = mode(prices.peek, "a", [1, 2, 3])
    assert found == {1: Fetched({"shop": "a", "id": 1}, False), 2: Fetched({"shop": "a", "id": 2}, False), 3: None}
    assert len(shops.queries) == 1  # a peek loads nothing
    mode(price, "a", 3)
    assert mode(prices.peek, "a", [3]) == {3: Fetched({"shop": "a", "id": 3}, False)}  # one entry for both
    assert prices.hot_set != price.hot_set
    assert recorded(layer, prices) == [("a", [1]), ("a", [2])]
    assert recorded(layer, price) == [("a", 3)]


def test_hot_sets_exported_survive_an_empty_cache_and_a_new_namespace(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """A cache server restarted empty, a flush or a bumped namespace takes the hot sets
    with the values. An export (JSON, through a file) imported into an empty hot set,
    here a new namespace's, makes the warm start load what the old one recorded, hottest
    first; an import into a hot set that holds calls imports nothing."""
    old = layer_of_each_backend(namespace=f"hot-{uuid.uuid4().hex[:8]}")
    shops = Shops()
    db = Database()
    load = old.cached_loader("item:{key}", hot_sample=1.0)(mode.loader(db))
    prices = old.cached_loader_many("price:{shop}:{id}", batch="ids", hot_sample=1.0)(shops.loader(mode))
    for key, times in ((1, 3), (2, 2), (3, 1)):
        for _ in range(times):
            mode(load, key)
    mode(prices, "a", [7, 8])
    old.flush_hot_sets()
    snapshot = json.loads(json.dumps(old.export_hot_sets(load, prices)))
    assert [call for call, _ in snapshot["sets"][load.hot_set.name]] == ["[[1],{}]", "[[2],{}]", "[[3],{}]"]
    assert old.export_hot_sets(load, count=1)["sets"][load.hot_set.name] == [["[[1],{}]", 3.0]]

    new = layer_of_each_backend(namespace=f"hot-{uuid.uuid4().hex[:8]}")
    new_db, new_shops = Database(), Shops()
    new_load = new.cached_loader("item:{key}", hot_sample=1.0)(mode.loader(new_db))
    new_prices = new.cached_loader_many("price:{shop}:{id}", batch="ids", hot_sample=1.0)(new_shops.loader(mode))
    assert recorded(new, new_load) == []
    assert new.import_hot_sets(snapshot, new_load, new_prices) == 5
    assert recorded(new, new_load) == [(1,), (2,), (3,)]
    assert new.import_hot_sets(snapshot, new_load, new_prices) == 0  # not empty now: imported once
    report = warm(new, mode, new_load, new_prices)
    assert (report.calls, report.loaded) == (5, 5)
    assert new_db.calls == {1: 1, 2: 1, 3: 1} and new_shops.queries == [("a", [7, 8])]


def test_what_is_not_a_hot_set_export_is_refused_with_nothing_imported() -> None:
    layer = Stampede.from_url("memory://", namespace="refused-import")
    try:
        load = layer.cached_loader("item:{key}")(lambda key: key)
        good = [["[[1],{}]", 2.0]]
        for bad, why in (
            ({}, "not an export of stampede hot sets"),
            ({"stampede_hot_sets": 1}, "without its sets"),
            ({"stampede_hot_sets": 1, "sets": {load.hot_set.name: [["not json", 1]]}}, "not a recorded call"),
            ({"stampede_hot_sets": 1, "sets": {load.hot_set.name: [*good, ["[[2],{}]", "many"]]}}, "scores"),
            ({"stampede_hot_sets": 1, "sets": {load.hot_set.name: [*good, [3]]}}, "not \\[call, score\\]"),
        ):
            with pytest.raises(ValueError, match=why):
                layer.import_hot_sets(bad, load)
        assert recorded(layer, load) == []  # nothing written by any of them
        with pytest.raises(ConfigError, match="count"):
            layer.export_hot_sets(load, count=0)
    finally:
        layer.close()


def test_a_layer_with_only_an_asyncio_client_is_told_what_a_warm_start_needs(redis_url: str) -> None:
    """Hot sets are recorded and read through the blocking client: an asyncio-only layer
    is refused ``hot_sample`` at decoration, and ``awarm`` and the exports say why."""
    layer = Stampede(async_client=lambda: redis.asyncio.Redis.from_url(redis_url, socket_timeout=2))
    try:

        async def item(key: int) -> int:
            return key

        with pytest.raises(ConfigError, match="hot_sample needs a blocking client"):
            layer.cached_loader("item:{key}", hot_sample=0.5)(item)
        load = layer.cached_loader("item:{key}")(item)
        with pytest.raises(ConfigError, match=r"awarm\(\) needs a blocking client \(Stampede.from_url gives one"):
            asyncio.run(layer.awarm(load))
        for method in (layer.export_hot_sets, lambda *loaders: layer.import_hot_sets({}, *loaders)):
            with pytest.raises(ConfigError, match="needs a blocking client"):
                method(load)
    finally:
        layer.close()
