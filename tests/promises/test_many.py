"""The promises of cached_loader_many, over every backend and both kinds of loader: a
page of entries read in one round trip, each entry loaded once, the same entries,
leases and wake-ups as cached_loader's."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from stampede import ConfigError, InvalidKey, RecursiveLoad, Stampede

from ..modes import TIMEOUT, Blocking, OnALoop
from .test_behaviour import lock_is_held

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
    mode(load, [1, 2, 3])
    assert db.queries == [[1, 2, 3], [1, 2, 3]]


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
