"""The promises of cached_loader_many, over every backend and both kinds of loader: a
page of entries read in one round trip, each entry loaded once, the same entries,
leases and wake-ups as cached_loader's."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from stampede import BackendUnavailable, ConfigError, InvalidKey, RecursiveLoad, Stampede, WaitTimeout
from stampede._core.keys import EntryKeys
from stampede.testing import ClusterServers, RedisServer

from ..modes import TIMEOUT, Blocking, OnALoop
from .test_behaviour import lock_is_held
from .test_processes import Workers

LEFT_OUT = object()  # what ManyDatabase's result gives for an id the loader leaves out


class ManyDatabase:
    """A fake database answering many ids per query, for either kind of loader. Records
    the ids of each query, sets ``started`` when one begins, and waits for ``release``
    (set unless the test clears it). ``result(id)`` may raise (the whole query fails) or
    give ``LEFT_OUT`` (the id is not in the mapping returned)."""

    def __init__(self, result: Callable[[Any], Any] = lambda id_: {"id": id_}) -> None:
        self.result = result
        self.queries: list[list[Any]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self._lock = threading.Lock()

    def _read(self, ids: Iterable[Any]) -> dict[Any, Any]:
        ids = list(ids)
        with self._lock:
            self.queries.append(ids)
        self.started.set()
        rows = {id_: self.result(id_) for id_ in ids}
        return {id_: row for id_, row in rows.items() if row is not LEFT_OUT}

    def load(self, ids: list[Any]) -> dict[Any, Any]:
        rows = self._read(ids)
        assert self.release.wait(TIMEOUT), "the test never released the loader"
        return rows

    def coroutine(self) -> Callable[[list[Any]], Any]:
        async def load(ids: list[Any]) -> dict[Any, Any]:
            rows = self._read(ids)
            if not self.release.is_set():
                released = await asyncio.get_running_loop().run_in_executor(None, self.release.wait, TIMEOUT)
                assert released, "the test never released the loader"
            return rows

        return load

    @property
    def asked(self) -> Counter[Any]:
        """How often each id was asked for, over every query."""
        return Counter(id_ for query in self.queries for id_ in query)


def many_loader(layer: Stampede, mode: Blocking | OnALoop, db: ManyDatabase, **options: Any) -> Any:
    return layer.cached_loader_many("item:{item_id}", **options)(mode.loader(db))  # type: ignore[arg-type]


def single_loader(layer: Stampede, mode: Blocking | OnALoop, calls: list[Any], release: threading.Event) -> Any:
    """A single-key loader of the same entries as ``many_loader``'s."""
    if mode.name == "blocking":

        def item(item_id: int) -> dict[str, Any]:
            calls.append(item_id)
            assert release.wait(TIMEOUT)
            return {"id": item_id, "single": True}

        return layer.cached_loader("item:{item_id}")(item)

    async def aitem(item_id: int) -> dict[str, Any]:
        calls.append(item_id)
        await asyncio.get_running_loop().run_in_executor(None, release.wait, TIMEOUT)
        return {"id": item_id, "single": True}

    return layer.cached_loader("item:{item_id}")(aitem)


def test_a_page_is_answered_in_the_order_asked_and_each_id_loaded_once(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = ManyDatabase(result=lambda id_: LEFT_OUT if id_ == 2 else {"id": id_})
    load = many_loader(layer, mode, db)

    assert mode(load, []) == {}
    assert db.queries == []  # an empty request does no load (and no I/O)
    page = mode(load, [3, 1, 2, 3, 1])
    assert list(page) == [3, 1, 2] and page == {3: {"id": 3}, 1: {"id": 1}, 2: None}
    assert db.queries == [[3, 1, 2]]  # duplicates asked once, in one query

    again = mode(load, [2, 4, 1, 3])
    assert again == {2: None, 4: {"id": 4}, 1: {"id": 1}, 3: {"id": 3}}
    assert db.queries == [[3, 1, 2], [4]]  # the left-out id is cached as None: not asked again
    stats = layer.stats()
    assert stats["loads"] == 4 and stats["batch_loads"] == 2
    assert stats["hits"] + stats["null_hits"] + stats["near_hits"] == 3


def test_single_and_many_key_loaders_of_a_template_share_entries(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = ManyDatabase()
    load = many_loader(layer, mode, db)
    single_calls: list[Any] = []
    released = threading.Event()
    released.set()
    one = single_loader(layer, mode, single_calls, released)

    assert mode(one, 1) == {"id": 1, "single": True}
    assert mode(load, [1, 2]) == {1: {"id": 1, "single": True}, 2: {"id": 2}}
    assert db.queries == [[2]]
    assert mode(one, 2) == {"id": 2}
    assert single_calls == [1]
    assert load.key(2) == one.key(2) == "test:{item:2}"


def test_overlapping_pages_at_once_load_every_id_once(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = ManyDatabase()
    load = many_loader(layer, mode, db)
    pages = [list(range(start, start + 20)) for start in range(0, 80, 5)]  # 16 pages, each id on up to 4

    results = mode.burst(load, pages)

    assert db.asked == Counter(range(95))  # every id once, over all the queries
    assert results == [{id_: {"id": id_} for id_ in page} for page in pages]
    assert not any(lock_is_held(layer, load.key(id_)) for id_ in range(95))


def test_a_page_waits_for_a_single_load_in_flight_and_does_not_reload_it(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = ManyDatabase()
    load = many_loader(layer, mode, db)
    single_calls: list[Any] = []
    release = threading.Event()
    one = single_loader(layer, mode, single_calls, release)
    single = mode.start(one, 5)
    until(lambda: single_calls == [5])

    page = mode.start(load, [4, 5, 6])
    until(lambda: db.queries == [[4, 6]])  # 5 is the single load's: waited for, not asked
    release.set()

    assert page.result(TIMEOUT) == {4: {"id": 4}, 5: {"id": 5, "single": True}, 6: {"id": 6}}
    assert single.result(TIMEOUT) == {"id": 5, "single": True}
    assert db.queries == [[4, 6]] and single_calls == [5]


def test_a_single_call_waits_for_a_page_in_flight(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = ManyDatabase()
    db.release.clear()
    load = many_loader(layer, mode, db)
    single_calls: list[Any] = []
    released = threading.Event()
    released.set()
    one = single_loader(layer, mode, single_calls, released)

    page = mode.start(load, [7, 8])
    assert db.started.wait(TIMEOUT)
    single = mode.start(one, 8)
    other_page = mode.start(load, [8, 9])
    until(lambda: [9] in db.queries)
    db.release.set()

    assert page.result(TIMEOUT) == {7: {"id": 7}, 8: {"id": 8}}
    assert single.result(TIMEOUT) == {"id": 8}
    assert other_page.result(TIMEOUT) == {8: {"id": 8}, 9: {"id": 9}}
    assert single_calls == [] and db.asked == Counter({7: 1, 8: 1, 9: 1})


def test_a_failing_loader_fails_its_callers_and_leaves_no_lease(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    failing = {"on": False}

    def result(id_: Any) -> Any:
        if failing["on"]:
            raise RuntimeError("the database is down")
        return {"id": id_}

    db = ManyDatabase(result=result)
    load = many_loader(layer, mode, db)
    mode(load, [1])  # 1 is cached: a failure of the others leaves it alone
    failing["on"] = True

    outcomes = mode.burst(load, [[1, 2, 3]] * 8, errors=RuntimeError)

    assert all(isinstance(outcome, RuntimeError) for outcome in outcomes)
    assert len(db.queries) <= 1 + 8  # no retry storm: at most one query per caller
    assert not any(lock_is_held(layer, load.key(id_)) for id_ in (1, 2, 3))
    failing["on"] = False
    queries = len(db.queries)
    assert mode(load, [1, 2, 3]) == {1: {"id": 1}, 2: {"id": 2}, 3: {"id": 3}}
    assert db.queries[queries:] == [[2, 3]]
    assert db.queries[0] == [1]


@pytest.mark.parametrize("result", [[{"id": 1}], "rows", 7])
def test_a_result_that_is_not_a_mapping_is_a_clear_error_and_nothing_is_written(
    layer_of_each_backend: Callable[..., Stampede], result: Any
) -> None:
    layer = layer_of_each_backend()

    @layer.cached_loader_many("bad:{item_id}")
    def bad(item_ids: list[int]) -> Any:
        return result

    with pytest.raises(TypeError, match=r"many-key loader .*bad"):
        bad([1, 2])
    assert not any(lock_is_held(layer, bad.key(id_)) for id_ in (1, 2))
    assert layer.stats()["loads"] == 2 and layer.stats()["hits"] == 0


def test_a_list_in_the_order_asked_is_a_result_too(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend()

    @layer.cached_loader_many("square:{n}")
    def squares(ns: list[int]) -> list[int]:
        return [n * n for n in ns]

    assert squares([3, 2]) == {3: 9, 2: 4}
    assert squares([2, 4]) == {2: 4, 4: 16}


def test_an_invalidation_during_the_load_keeps_that_id_from_being_written(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = ManyDatabase()
    db.release.clear()
    load = many_loader(layer, mode, db)

    page = mode.start(load, [1, 2])
    assert db.started.wait(TIMEOUT)
    mode(load.invalidate, 2)
    db.release.set()
    assert page.result(TIMEOUT) == {1: {"id": 1}, 2: {"id": 2}}  # the caller's call began before

    assert mode(load, [1, 2]) == {1: {"id": 1}, 2: {"id": 2}}
    assert db.queries == [[1, 2], [2]]  # 2's result was not written; 1's was
    assert layer.stats()["stale_writes_prevented"] == 1


def test_invalidate_and_expire_take_one_id_or_many(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = ManyDatabase()
    load = many_loader(layer, mode, db)
    mode(load, [1, 2, 3])

    mode(load.invalidate, [1, 2])
    mode(load.expire, 3)
    assert mode(load, [1, 2, 3]) == {id_: {"id": id_} for id_ in (1, 2, 3)}
    # 3 is loaded again too: at once, or (STAMPEDE_TEST_FRESHNESS) served stale and refreshed
    until(lambda: db.asked == Counter({1: 2, 2: 2, 3: 2}))


def test_a_request_larger_than_max_batch_is_split(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = ManyDatabase()
    load = many_loader(layer, mode, db, max_batch=4)

    page = mode(load, list(range(10)))

    assert page == {id_: {"id": id_} for id_ in range(10)}
    assert db.queries == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_fixed_parameters_key_the_entries_and_methods_bind(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend()
    queries: list[tuple[str, list[int]]] = []

    class Catalog:
        @layer.cached_loader_many("price:{shop}:{product_id}")
        def prices(self, shop: str, product_ids: list[int], currency: str = "EUR") -> dict[int, str]:
            queries.append((shop, list(product_ids)))
            return {product_id: f"{shop}-{product_id}-{currency}" for product_id in product_ids}

    catalog = Catalog()
    assert catalog.prices("north", [1, 2]) == {1: "north-1-EUR", 2: "north-2-EUR"}
    assert catalog.prices(shop="south", product_ids=(2,)) == {2: "south-2-EUR"}
    assert catalog.prices("north", [2, 1]) == {2: "north-2-EUR", 1: "north-1-EUR"}
    assert queries == [("north", [1, 2]), ("south", [2])]
    assert catalog.prices.key("north", 1) == "test:{price:north:1}"
    catalog.prices.invalidate("north", 1)
    assert catalog.prices("north", [1]) == {1: "north-1-EUR"}
    assert queries[-1] == ("north", [1])


def test_bad_declarations_and_bad_ids_are_refused(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend()

    def rows(ids: list[int]) -> dict[int, int]:
        return {}

    with pytest.raises(ConfigError, match="exactly one field"):
        layer.cached_loader_many("row:{ids}")(rows)
    with pytest.raises(ConfigError, match="needs a key template|takes a key template"):
        layer.cached_loader_many(None)(rows)  # type: ignore[arg-type]

    def two(a: list[int], b: list[int]) -> dict[int, int]:
        return {}

    with pytest.raises(ConfigError, match="batch="):
        layer.cached_loader_many("row:{id}")(two)
    assert layer.cached_loader_many("row:{id}", batch="b")(two).key([], 5) == "test:{row:5}"

    load = layer.cached_loader_many("row:{row_id}")(rows)
    with pytest.raises(TypeError, match="collection"):
        load(7)
    with pytest.raises(TypeError, match="collection"):
        load("abc")
    with pytest.raises(TypeError, match="hashable"):
        load([[1], [2]])
    with pytest.raises(InvalidKey):
        load([float("nan")])
    with pytest.raises(ConfigError, match="max_batch"):
        layer.cached_loader_many("row:{row_id}", max_batch=0)


def test_a_loader_that_asks_for_its_own_ids_is_refused(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend(wait_timeout=2.0)

    @layer.cached_loader_many("self:{n}")
    def loops(ns: list[int]) -> dict[int, int]:
        again: dict[int, int] = loops(ns)
        return again

    with pytest.raises(RecursiveLoad):
        loops([1])


def until(condition: Callable[[], Any], timeout: float = TIMEOUT) -> None:
    """Wait for ``condition`` to hold: an observable state, polled."""
    done = threading.Event()
    deadline = threading.Timer(timeout, done.set)
    deadline.start()
    try:
        while not condition():
            assert not done.wait(0.002), "condition not met in time"
    finally:
        deadline.cancel()


MANY_WORKER = str(Path(__file__).parent.parent.joinpath("many_worker.py"))


def test_overlapping_pages_in_four_processes_load_every_id_once(redis_url: str, redis_client: redis.Redis) -> None:
    redis_client.delete(*[f"asked:{id_}" for id_ in range(500)], "queries")
    workers = Workers()
    try:
        started = [
            workers.start(redis_url, "--threads", "8", "--pages", "3", "--seed", str(seed), script=MANY_WORKER)
            for seed in range(4)
        ]
        for process in started:
            workers.expect(process, "ready")
        workers.go(started)  # the barrier: every worker waits for this line
        results = [workers.result(process, timeout=60) for process in started]
    finally:
        workers.stop_all()

    asked = [int(redis_client.get(f"asked:{id_}") or 0) for id_ in range(500)]
    assert max(asked) == 1  # the database's own count: no id asked twice, across processes
    loads = sum(result["stats"]["loads"] for result in results)
    assert loads == sum(asked)  # each load the stats count is an id the database was asked for
    assert all(result["wrong"] == [] for result in results)
    assert sum(result["stats"]["batch_loads"] for result in results) == int(redis_client.get("queries") or 0)


def commands_run(client: redis.Redis) -> Counter[str]:
    """Each command's count on the server since it started (INFO commandstats)."""
    return Counter(
        {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in client.info("commandstats").items()}
    )


def commands_between(client: redis.Redis, before: Counter[str]) -> Counter[str]:
    after = commands_run(client)
    after.subtract(before)
    after["info"] -= 1  # the INFO that read ``after``
    return +after


PLAIN = {"near_cache": False, "stale_while_revalidate": 0, "stale_if_error": 0, "early_refresh": 0}
"""No near cache and no freshness settings, whatever the environment asks (a read with a
TTL is a pipeline of GET and PTTL, not an MGET)."""


def test_a_warm_page_is_one_command_on_one_server(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer(**PLAIN)
    db = ManyDatabase()
    load = layer.cached_loader_many("item:{item_id}")(db.load)
    page = list(range(50))
    load(page)

    before = commands_run(redis_client)
    assert load(page) == {id_: {"id": id_} for id_ in page}
    assert commands_between(redis_client, before) == Counter({"mget": 1})
    assert len(db.queries) == 1


def test_a_cold_page_takes_its_leases_and_writes_in_one_round_trip_each(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer(**PLAIN)
    db = ManyDatabase()
    load = layer.cached_loader_many("item:{item_id}")(db.load)
    load([0])  # the scripts are known to the server

    before = commands_run(redis_client)
    load(list(range(1, 51)))
    ran = commands_between(redis_client, before)
    assert ran["mget"] == 1 and ran["evalsha"] == 2  # one script takes the 50 leases, one writes the 50 values
    assert db.queries == [[0], list(range(1, 51))]


def test_entries_a_page_must_ask_again_are_read_again_together(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis, mode: Blocking | OnALoop
) -> None:
    """Layer B's first caller waits for a page layer A is loading (B's flights subscribe
    to A's wake-ups); a second caller in B joins those flights after that. The values
    reach B in A's messages, written after the second caller joined, so they cannot be
    handed to it: it asks for the ten entries again, in one MGET, not a GET each. (B's
    re-checks wait a minute: a re-check of its own that found the values would hand them
    over by a command sent after the second caller joined, with nothing to ask again,
    which a stalled machine made happen once at the default second.)"""
    layer_a, layer_b = make_layer(**PLAIN), make_layer(**PLAIN, recheck_interval=60.0)
    db, never = ManyDatabase(), ManyDatabase()
    db.release.clear()
    load_a, load_b = many_loader(layer_a, mode, db), many_loader(layer_b, mode, never)
    page = list(range(10))
    keys = [load_b.key(id_) for id_ in page]
    loading = mode.start(load_a, page)
    assert db.started.wait(TIMEOUT)
    first = mode.start(load_b, page)
    channels = [EntryKeys.for_value(key).channel for key in keys]
    until(lambda: all(count >= 1 for _, count in redis_client.pubsub_numsub(*channels)))  # B's first caller waits
    runner: Any = layer_b._runner if mode.name == "blocking" else layer_b._async_runner._loops[mode.loop]  # type: ignore[union-attr]
    second = mode.start(load_b, page)
    until(lambda: all(runner.flights._flights[key].done is not None for key in keys))  # the second caller joined
    before, reads = commands_run(redis_client), layer_b.stats()["batch_reads"]
    db.release.set()
    expected = {id_: {"id": id_} for id_ in page}
    assert loading.result(TIMEOUT) == first.result(TIMEOUT) == second.result(TIMEOUT) == expected
    ran = commands_between(redis_client, before)
    assert ran["mget"] == 1, ran  # the second caller's one read of the ten again (a GET each before)
    assert layer_b.stats()["batch_reads"] == reads + 1
    assert db.queries == [page] and never.queries == []


def test_scripts_the_server_forgot_are_sent_again(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer(near_cache=False)
    db = ManyDatabase()
    load = layer.cached_loader_many("item:{item_id}")(db.load)
    load([1])
    redis_client.script_flush()

    assert load([2, 3]) == {2: {"id": 2}, 3: {"id": 3}}
    assert load([2, 3]) == {2: {"id": 2}, 3: {"id": 3}}
    assert db.queries == [[1], [2, 3]]


def test_a_page_on_a_cluster_is_one_read_per_server(
    make_cluster_layer: Callable[..., Stampede], cluster_servers: ClusterServers
) -> None:
    layer = make_cluster_layer(**PLAIN)
    db = ManyDatabase()
    load = layer.cached_loader_many("item:{item_id}")(db.load)
    page = list(range(60))  # their slots span every primary
    clients = [redis.Redis.from_url(primary.url) for primary in cluster_servers.primaries]
    for client in clients:
        client.script_flush()  # the first batch's scripts go again by EVAL
    try:
        assert load(page) == {id_: {"id": id_} for id_ in page}
        before = [commands_run(client) for client in clients]
        assert load(page) == {id_: {"id": id_} for id_ in page}
        reads = [commands_between(client, counted) for client, counted in zip(clients, before, strict=True)]
    finally:
        for client in clients:
            client.close()
    assert db.queries == [page]
    owners = {cluster_servers.owner(load.key(id_)).url for id_ in page}
    assert len(owners) == len(clients)
    assert all(ran["mget"] >= 1 and set(ran) == {"mget"} for ran in reads)
    assert sum(ran["mget"] for ran in reads) == len({key_slot(load.key(id_).encode()) for id_ in page})


def test_stale_entries_are_served_and_refreshed_in_one_background_call(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    # A ttl the run cannot outlive (under load, one of 0.3 s ran out again before the last
    # read, and a second refresh ran): expire() makes the entries stale instead.
    layer = layer_of_each_backend(ttl=300, stale_while_revalidate=30.0, early_refresh=0.0, jitter=0)
    versions = Counter[Any]()

    def result(id_: Any) -> Any:
        versions[id_] += 1
        return {"id": id_, "v": versions[id_]}

    db = ManyDatabase(result=result)
    load = many_loader(layer, mode, db)
    assert mode(load, [1, 2, 3]) == {id_: {"id": id_, "v": 1} for id_ in (1, 2, 3)}
    mode(load.expire, [1, 2, 3])  # past their ttl, within stale_while_revalidate

    assert mode(load, [1, 2, 3]) == {id_: {"id": id_, "v": 1} for id_ in (1, 2, 3)}  # stale, at once
    until(lambda: len(db.queries) == 2 and layer.stats()["refreshes"] == 3)
    assert sorted(db.queries[1]) == [1, 2, 3]  # one background call for the three
    until(lambda: mode(load, [1, 2, 3]) == {id_: {"id": id_, "v": 2} for id_ in (1, 2, 3)})
    assert len(db.queries) == 2 and layer.stats()["stale_hits"] >= 3


@pytest.mark.parametrize("policy", ["load", "raise"])
def test_a_page_while_the_server_is_down_loads_once_without_the_cache_or_raises(
    own_server: RedisServer, mode: Blocking | OnALoop, policy: str
) -> None:
    layer = Stampede.from_url(own_server.url, namespace="test", on_backend_error=policy, breaker_threshold=0)
    try:
        db = ManyDatabase()
        load = many_loader(layer, mode, db)
        assert mode(load, [1]) == {1: {"id": 1}}
        own_server.kill()

        if policy == "raise":
            with pytest.raises(BackendUnavailable):
                mode(load, [1, 2, 3])
            assert db.queries == [[1]]
        else:
            assert mode(load, [1, 2, 3]) == {1: {"id": 1}, 2: {"id": 2}, 3: {"id": 3}}
            assert db.queries == [[1], [1, 2, 3]]  # one loader call, uncached
            assert layer.stats()["redis_errors"] == 1  # the first read's failure, counted once
    finally:
        own_server.start()
        if mode.name == "asyncio":
            mode(layer.aclose)
        layer.close()


def test_a_page_maps_the_ids_asked_though_the_callers_list_changes_during_the_call(
    make_layer: Callable[..., Stampede],
) -> None:
    """The call keeps its own copy of the ids: a caller's list changed while its page
    loads (here by the loader itself) never pairs one id with another's value."""
    layer = make_layer(**PLAIN)
    page = [1, 2, 3]

    @layer.cached_loader_many("changing:{item_id}")
    def load(item_ids: list[int]) -> dict[int, dict[str, int]]:
        page[:] = [7, 8, 9]
        return {id_: {"id": id_} for id_ in item_ids}

    assert load(page) == {1: {"id": 1}, 2: {"id": 2}, 3: {"id": 3}}
    assert load([1, 2, 3]) == {1: {"id": 1}, 2: {"id": 2}, 3: {"id": 3}}  # as written


def test_an_id_whose_holder_died_is_taken_over(make_layer: Callable[..., Stampede], mode: Blocking | OnALoop) -> None:
    layer = make_layer(lock_ttl=0.3, near_cache=False)
    db = ManyDatabase()
    load = many_loader(layer, mode, db)
    assert layer._runner is not None
    dead = EntryKeys.for_value(load.key(5))
    # Never renewed; 1.5 s, not the layer's 0.3: the call must find it still held even on a
    # loaded machine where an event loop's first call takes longer than 0.3 s (it did, in CI).
    assert layer._runner.store.acquire(dead, "a dead holder", 1500, True).state.name == "LOCKED"

    assert mode(load, [4, 5, 6]) == {4: {"id": 4}, 5: {"id": 5}, 6: {"id": 6}}
    assert db.queries == [[4, 6], [5]]  # 5 waited for its holder's lease, then was taken over
    assert layer.stats()["takeovers"] == 1


def test_ids_whose_holder_died_are_taken_over_together(
    make_layer: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """A page that waits on several leases of a holder that died (a process killed, a
    primary failed over with its leases) takes them over together once they run out: one
    loader call for them all. Its waits were charged one after the other: each id was
    re-checked once every three ``recheck_interval`` and taken over alone, a loader call
    each, a second apart."""
    layer = make_layer(lock_ttl=0.3, near_cache=False)
    db = ManyDatabase()
    load = many_loader(layer, mode, db)
    assert layer._runner is not None
    dead = [(EntryKeys.for_value(load.key(item)), "a dead holder", 1500, True, b"") for item in (5, 6, 7)]
    # In one round trip, so that they run out together; never renewed (see the test above).
    assert [reply.state.name for reply in layer._runner.store.acquire_many(dead)] == ["LOCKED"] * 3  # type: ignore[union-attr]

    assert mode(load, [4, 5, 6, 7]) == {item: {"id": item} for item in (4, 5, 6, 7)}
    assert db.queries == [[4], [5, 6, 7]]  # 5, 6 and 7 waited for their holder's leases, then were taken over
    assert layer.stats()["takeovers"] == 3


def test_prometheus_counts_a_page_per_id_and_per_loader_call(redis_url: str) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")  # an extra: not in every install CI tests
    from stampede.prometheus import PrometheusMetrics

    CollectorRegistry = prometheus_client.CollectorRegistry

    registry = CollectorRegistry()
    namespace = f"many-{uuid.uuid4().hex[:8]}"
    layer = Stampede.from_url(redis_url, namespace=namespace, observers=[PrometheusMetrics(registry)])
    try:
        db = ManyDatabase()
        load = layer.cached_loader_many("item:{item_id}")(db.load)
        load([1, 2, 3])
        load([1, 2, 3, 4])

        def sample(name: str) -> float | None:
            return registry.get_sample_value(f"stampede_{name}_total", {"namespace": namespace})

        assert sample("loads") == 4 and sample("batch_loads") == 2  # per id, and per loader call
        assert sample("hits") == 3 and sample("misses") == 4 and sample("batch_reads") == 2
        assert {name: sample(name) for name in ("loads", "hits", "misses")} == {
            name: layer.stats()[name] for name in ("loads", "hits", "misses")
        }
    finally:
        layer.close()


@pytest.mark.timing
def test_the_watchdog_renews_every_lease_of_a_running_batch(
    make_layer: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = make_layer(lock_ttl=0.3, near_cache=False)
    db = ManyDatabase()
    db.release.clear()
    load = many_loader(layer, mode, db)

    page = mode.start(load, [1, 2, 3])
    assert db.started.wait(TIMEOUT)
    renewed = threading.Event()
    assert not renewed.wait(0.9)  # three terms of the lease: only renewals keep it
    assert all(lock_is_held(layer, load.key(id_)) for id_ in (1, 2, 3))
    db.release.set()

    assert page.result(TIMEOUT) == {1: {"id": 1}, 2: {"id": 2}, 3: {"id": 3}}
    assert layer.stats()["stale_writes_prevented"] == 0
    assert mode(load, [1, 2, 3]) == {1: {"id": 1}, 2: {"id": 2}, 3: {"id": 3}}
    assert db.queries == [[1, 2, 3]]  # written: the leases were still the batch's


@pytest.mark.parametrize("policy", ["load", "raise"])
def test_an_id_held_past_wait_timeout_follows_on_wait_timeout(
    make_layer: Callable[..., Stampede], mode: Blocking | OnALoop, policy: str
) -> None:
    layer = make_layer(wait_timeout=0.5, on_wait_timeout=policy, near_cache=False)
    db = ManyDatabase()
    load = many_loader(layer, mode, db)
    assert layer._runner is not None
    stuck = EntryKeys.for_value(load.key(5))
    assert layer._runner.store.acquire(stuck, "a slow holder", 60_000, True).state.name == "LOCKED"

    if policy == "raise":
        with pytest.raises(WaitTimeout):
            mode(load, [4, 5])
        assert db.queries == [[4]]
    else:
        assert mode(load, [4, 5]) == {4: {"id": 4}, 5: {"id": 5}}
        assert db.queries == [[4], [5]]  # 5 loaded without the cache once the wait ran out
    assert layer.stats()["wait_timeouts"] == 1
    assert mode(load, [4]) == {4: {"id": 4}}  # 4 was written either way
    assert len(db.queries) == (1 if policy == "raise" else 2)


def test_a_cancelled_page_releases_every_lease_and_its_joiners_go_on(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend()
    on_a_loop = OnALoop()
    try:
        db = ManyDatabase()
        db.release.clear()
        load = many_loader(layer, on_a_loop, db)
        page = on_a_loop.start(load, [1, 2, 3])
        assert db.started.wait(TIMEOUT)
        joiner = on_a_loop.start(load, [2, 4])  # joins 2 in this loop, leads 4
        until(lambda: [4] in db.queries)  # it leads 4 alone: it joined the page's flight of 2

        page.cancel()
        until(lambda: page.cancelled() or page.done())
        until(lambda: not any(lock_is_held(layer, load.key(id_)) for id_ in (1, 2, 3)))
        db.release.set()

        assert joiner.result(TIMEOUT) == {2: {"id": 2}, 4: {"id": 4}}  # it started over and led 2
        assert on_a_loop(load, [1, 2, 3]) == {1: {"id": 1}, 2: {"id": 2}, 3: {"id": 3}}
        assert db.asked[2] == 2 and db.asked[4] == 1
    finally:
        on_a_loop.close()


def test_a_page_fills_the_near_cache_and_an_invalidation_drops_its_copy(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis, mode: Blocking | OnALoop
) -> None:
    from ..families.test_near_cache import held, tracked

    layer = make_layer(near_cache=True, near_lease=5.0, stale_while_revalidate=0, stale_if_error=0, early_refresh=0)
    db = ManyDatabase()
    load = many_loader(layer, mode, db)
    page = list(range(10))
    tracked(layer)
    near, tracker = layer._near, layer._backend.tracker
    assert near is not None and tracker is not None

    def copied() -> bool:
        """Every entry of the page is copied, and stays so once the tracking messages of
        this process's own writes (which spoil a copy) have all come in."""
        assert mode(load, page) == {id_: {"id": id_} for id_ in page}
        if not all(held(layer, load.key(id_)) for id_ in page):
            return False
        since = time.monotonic()
        until(lambda: near.lease_until > since + tracker._lease)  # a renewal sent after: caught up
        return all(held(layer, load.key(id_)) for id_ in page)

    until(copied)
    near_hits = layer.stats()["near_hits"]
    before = commands_run(redis_client)
    assert mode(load, page) == {id_: {"id": id_} for id_ in page}
    assert layer.stats()["near_hits"] == near_hits + 10
    assert not set(commands_between(redis_client, before)) & {"mget", "get", "evalsha"}  # no read of the page

    mode(load.invalidate, 3)  # every near cache has dropped its copy when this returns
    assert not held(layer, load.key(3))
    assert mode(load, page) == {id_: {"id": id_} for id_ in page}
    assert db.queries == [page, [3]]
