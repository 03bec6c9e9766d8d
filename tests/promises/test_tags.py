"""Tags: ``invalidate_tag`` and ``expire_tag`` over every backend that has them, blocking
and asyncio, and the promise that nothing stale survives one, even a load in flight
(``_core.tags``)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from stampede import ConfigError, InvalidKey, Stampede
from stampede._core.keys import EntryKeys

from ..modes import Blocking, Database, OnALoop

TAG_WORKER = str(Path(__file__).parent.parent.joinpath("tag_worker.py"))


def tagged_layer(make: Callable[..., Stampede], **options: Any) -> Stampede:
    """A layer of the backend under test."""
    return make(**options)


def invalidate_tag(layer: Stampede, mode: Blocking | OnALoop, tag: str, soft: bool = False, **fields: Any) -> int:
    """The tag invalidation of the mode's kind: blocking, or awaited in the mode's loop."""
    if mode.name == "blocking":
        return (layer.expire_tag if soft else layer.invalidate_tag)(tag, **fields)
    invalidate = layer.aexpire_tag if soft else layer.ainvalidate_tag
    return mode(lambda: invalidate(tag, **fields))  # type: ignore[no-any-return]


class Catalog(Database):
    """A database of product lists: each load returns the list's current version."""

    def __init__(self) -> None:
        self.version = 1
        super().__init__(result=lambda key: {"list": list(key), "version": self.version})


def list_loader(layer: Stampede, mode: Blocking | OnALoop, db: Database, **options: Any) -> Any:
    """``product_list(category_id, page)`` tagged by its category and by the catalog."""
    inner = mode.loader(db)
    if mode.name == "blocking":

        def product_list(category_id: int, page: int) -> Any:
            return inner((category_id, page))

    else:

        async def product_list(category_id: int, page: int) -> Any:  # type: ignore[misc]
            return await inner((category_id, page))

    return layer.cached_loader(
        "product-list:{category_id}:{page}", tags=["category:{category_id}", "catalog"], **options
    )(product_list)


def test_invalidate_tag_drops_every_entry_that_carries_it(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = tagged_layer(layer_of_each_backend)
    db = Catalog()
    product_list = list_loader(layer, mode, db)
    pages = [(1, 1), (1, 2), (2, 1)]
    for page in pages:
        mode(product_list, *page)
    db.version = 2

    assert invalidate_tag(layer, mode, "category:1") == 2
    assert [mode(product_list, *page)["version"] for page in pages] == [2, 2, 1]
    assert db.calls == {(1, 1): 2, (1, 2): 2, (2, 1): 1}

    db.version = 3
    assert invalidate_tag(layer, mode, "catalog") == 3
    assert [mode(product_list, *page)["version"] for page in pages] == [3, 3, 3]
    assert invalidate_tag(layer, mode, "category:9") == 0  # a tag nothing carries
    stats = layer.stats()
    assert stats["tag_invalidations"] == 3 and stats["tag_entries_dropped"] == 5


def test_a_load_in_flight_when_its_tag_is_invalidated_is_not_written(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = tagged_layer(layer_of_each_backend)
    db = Catalog()
    db.release.clear()
    product_list = list_loader(layer, mode, db)

    in_flight = mode.start(product_list, 7, 1)
    assert db.started.wait(5)
    db.version = 2  # the database changes while the old load runs
    assert invalidate_tag(layer, mode, "category:{category_id}", category_id=7) == 0  # not written yet: no member
    db.release.set()
    assert in_flight.result(5)["version"] == 1  # its own caller only
    assert mode(product_list, 7, 1)["version"] == 2  # the old value was not written
    assert mode(product_list, 7, 1)["version"] == 2
    assert db.calls == {(7, 1): 2}
    assert layer.stats()["stale_writes_prevented"] == 1


def test_a_load_that_began_after_the_invalidation_is_written(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = tagged_layer(layer_of_each_backend)
    db = Catalog()
    product_list = list_loader(layer, mode, db)
    invalidate_tag(layer, mode, "catalog")
    invalidate_tag(layer, mode, "category:1")

    assert mode(product_list, 1, 1)["version"] == 1
    assert mode(product_list, 1, 1)["version"] == 1
    assert db.calls == {(1, 1): 1}  # written: the generations predate its load
    assert layer.stats()["stale_writes_prevented"] == 0


def test_expire_tag_makes_its_entries_stale_and_refreshes_each_once(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = tagged_layer(layer_of_each_backend, stale_while_revalidate=60)
    db = Catalog()
    product_list = list_loader(layer, mode, db)
    for page in (1, 2):
        mode(product_list, 3, page)
    db.version = 2

    assert invalidate_tag(layer, mode, "category:3", soft=True) == 2
    assert [mode(product_list, 3, page)["version"] for page in (1, 2)] == [1, 1]  # stale, while refreshed
    deadline = time.monotonic() + 10
    while db.total < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    while [mode(product_list, 3, page)["version"] for page in (1, 2)] != [2, 2] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [mode(product_list, 3, page)["version"] for page in (1, 2)] == [2, 2]
    assert db.calls == {(3, 1): 2, (3, 2): 2}  # one refresh each
    # Still members while their values live: invalidate_tag drops what expire_tag left.
    assert invalidate_tag(layer, mode, "category:3") == 2


def test_expire_tag_without_a_stale_window_drops_the_entries(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = tagged_layer(layer_of_each_backend)
    db = Catalog()
    product_list = list_loader(layer, mode, db)
    mode(product_list, 4, 1)
    db.version = 2
    assert invalidate_tag(layer, mode, "catalog", soft=True) == 1
    assert mode(product_list, 4, 1)["version"] == 2


def test_a_load_in_flight_when_its_tag_expires_is_not_written(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = tagged_layer(layer_of_each_backend)
    mode = Blocking()
    db = Catalog()
    db.release.clear()
    product_list = list_loader(layer, mode, db)
    in_flight = mode.start(product_list, 5, 1)
    assert db.started.wait(5)
    db.version = 2
    layer.expire_tag("catalog")
    db.release.set()
    assert in_flight.result(5)["version"] == 1
    assert product_list(5, 1)["version"] == 2


def test_tags_render_as_keys_do(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer()
    calls: list[str] = []

    @layer.cached_loader("doc:{name}", tags=["folder:{name}"])
    def doc(name: str) -> str:
        calls.append(name)
        return name

    doc("a:b")
    doc("a")
    assert layer.invalidate_tag("folder:a") == 1  # not "a:b": its colon is escaped in the tag too
    assert layer.invalidate_tag("folder:{name}", name="a:b") == 1
    assert layer.invalidate_tag("folder:a%3Ab") == 0  # as rendered: already invalidated


def test_bad_tags_are_refused_at_decoration(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer()

    def product_list(category_id: int, page: int, user: str = "") -> list[int]:
        return []

    with pytest.raises(ConfigError, match="not a parameter"):
        layer.cached_loader("pl:{category_id}:{page}", tags=["category:{shop}"])(product_list)
    with pytest.raises(ConfigError, match="leaves out"):
        layer.cached_loader("pl:{category_id}:{page}", tags=["user:{user}"])(product_list)
    with pytest.raises(ConfigError, match="a list of templates"):
        layer.cached_loader("pl:{category_id}:{page}", tags="category:{category_id}")(product_list)
    with pytest.raises(ConfigError, match="literal text"):
        layer.cached_loader("pl:{category_id}:{page}", tags=["cat egory"])(product_list)
    # Without a template every parameter is in the key, so any may tag it.
    layer.cached_loader(tags=["user:{user}"])(untemplated)


def untemplated(category_id: int, user: str = "") -> list[int]:
    return []


def test_bad_tag_names_are_refused_before_any_io(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer()
    for bad in ("", "a b", "a{", "cat:{id}"):
        with pytest.raises(InvalidKey):
            layer.invalidate_tag(bad)
    with pytest.raises(InvalidKey, match="no placeholder"):
        layer.invalidate_tag("cat:1", id=1)
    with pytest.raises(InvalidKey, match="canonical"):
        layer.invalidate_tag("cat:{id}", id=object())


def test_members_are_forgotten_when_invalidated_and_pruned_when_expired(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer(jitter=0)

    @layer.cached_loader("p:{n}", tags=["all"], ttl=300)  # alive however slowly the 50 are written
    def p(n: int) -> int:
        return n

    @layer.cached_loader("q:{n}", tags=["all"], ttl=0.2)
    def q(n: int) -> int:
        return n

    for n in range(50):
        p(n)
    members = "test:tag:{all}"
    assert redis_client.zcard(members) == 50
    assert layer.invalidate_tag("all") == 50
    assert redis_client.zcard(members) == 0  # forgotten with their values
    for n in range(50):
        q(n)
    assert redis_client.zcard(members) == 50  # a member outlives its value by a margin of 1 s
    time.sleep(1.3)  # the values' 0.2 s, and the members' margin of 1 s
    assert layer.invalidate_tag("all") == 0  # an invalidation costs nothing for entries gone
    assert not redis_client.exists(members)
    assert not [key for key in redis_client.scan_iter("test:*") if not key.endswith((b":gen", b"clock"))]


def test_inspect_shows_an_entrys_tags(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer()

    @layer.cached_loader("p:{n}", tags=["cat:{n}", "all"])
    def p(n: int) -> int:
        return n

    p(1)
    store = layer._runner.store  # type: ignore[union-attr]
    assert store.entry_tags(EntryKeys.for_value(p.key(1))) == ["cat:1", "all"]
    layer.invalidate_tag("all")
    assert store.entry_tags(EntryKeys.for_value(p.key(1))) is None


@pytest.mark.parametrize("topology", ["redis", "cluster"])
def test_a_tag_invalidated_in_another_process_beats_its_load(
    topology: str, redis_url: str, request: pytest.FixtureRequest
) -> None:
    """The race across processes: a worker's load of a tagged entry is held open while
    this process invalidates the tag; its result is not written, not served to its
    next call, and not served here."""
    if topology == "cluster":
        servers = request.getfixturevalue("cluster_servers")
        url, options = servers.url, {"cluster": True}
        database: Any = redis.RedisCluster.from_url(url)
        for node in servers.primaries:
            redis.Redis.from_url(node.url).flushall()
    else:
        url, options = redis_url, {}
        database = redis.Redis.from_url(url)
        database.flushall()
    database.set("version", 1)
    worker = subprocess.Popen(
        [sys.executable, TAG_WORKER, "--url", url, *(["--cluster"] if options else [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdin is not None and worker.stdout is not None
    try:
        assert worker.stdout.readline().strip() == "ready"
        worker.stdin.write("go\n")
        worker.stdin.flush()
        assert worker.stdout.readline().strip() == "loading"
        database.set("version", 2)
        with Stampede.from_url(url, namespace="tags", **options) as layer:
            assert layer.invalidate_tag("category:1") == 0
            worker.stdin.write("release\n")
            worker.stdin.flush()
            assert worker.stdout.readline().strip() == "loading"  # its next call loads again
            worker.stdin.write("release\n")
            worker.stdin.flush()
            out, _ = worker.communicate(timeout=30)

            @layer.cached_loader("product-list:{category_id}", tags=["category:{category_id}"])
            def product_list(category_id: int) -> dict[str, Any]:
                raise AssertionError("the worker's second load is in the cache")

            assert product_list(1) == {"category": 1, "version": 2}
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(5)
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["first"]["version"] == 1 and seen["second"]["version"] == 2
    assert seen["stats"]["stale_writes_prevented"] == 1
    assert int(database.get("loads")) == 2


def test_readers_never_see_a_version_older_than_the_last_invalidation(make_layer: Callable[..., Stampede]) -> None:
    """Threads read while the database changes and its tag is invalidated after each
    change: a read that began after an invalidation returned never gets an older value."""
    layer = make_layer()
    db = Catalog()
    product_list = list_loader(layer, Blocking(), db)
    stop = threading.Event()
    invalidated = [1]  # the version whose invalidation last returned
    wrong: list[Any] = []

    def read() -> None:
        while not stop.is_set():
            seen = invalidated[-1]
            value = product_list(1, 1)
            if value["version"] < seen:
                wrong.append((seen, value))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(50):
            db.version += 1
            layer.invalidate_tag("category:1")
            invalidated.append(db.version)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert not wrong
    assert db.total <= 51  # one load per invalidation, at most, and the first


def test_a_many_key_loader_tags_each_entry_by_its_own_fields(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = tagged_layer(layer_of_each_backend)
    version = [1]
    asked: list[list[int]] = []

    def rows(shop: str, product_ids: list[int]) -> dict[int, Any]:
        asked.append(list(product_ids))
        return {id_: {"shop": shop, "id": id_, "version": version[0]} for id_ in product_ids}

    if mode.name == "blocking":
        prices: Any = rows
    else:

        async def prices(shop: str, product_ids: list[int]) -> dict[int, Any]:
            return rows(shop, product_ids)

    prices = layer.cached_loader_many("price:{shop}:{product_id}", tags=["shop:{shop}", "product:{product_id}"])(prices)
    mode(prices, "s1", [1, 2, 3])
    mode(prices, "s2", [1])
    version[0] = 2

    assert invalidate_tag(layer, mode, "product:1") == 2  # its price in both shops
    assert {id_: row["version"] for id_, row in mode(prices, "s1", [1, 2, 3]).items()} == {1: 2, 2: 1, 3: 1}
    assert invalidate_tag(layer, mode, "shop:s1") == 3
    assert [row["version"] for row in mode(prices, "s1", [1, 2, 3]).values()] == [2, 2, 2]
    assert asked == [[1, 2, 3], [1], [1], [1, 2, 3]]


def test_a_page_in_flight_when_its_tag_is_invalidated_is_not_written(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = tagged_layer(layer_of_each_backend)
    version, started, release = [1], threading.Event(), threading.Event()

    @layer.cached_loader_many("product:{product_id}", tags=["catalog"])
    def products(product_ids: list[int]) -> dict[int, Any]:
        seen = version[0]
        started.set()
        assert release.wait(10)
        return {id_: seen for id_ in product_ids}

    page = Blocking().start(products, [1, 2])
    assert started.wait(5)
    version[0] = 2
    layer.invalidate_tag("catalog")
    release.set()
    assert page.result(10) == {1: 1, 2: 1}  # its own caller's
    assert products([1, 2]) == {1: 2, 2: 2}
    assert layer.stats()["stale_writes_prevented"] == 2


def test_a_tagged_miss_reads_the_tag_clock_with_its_lease(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis, mode: Blocking | OnALoop
) -> None:
    """On one server a tagged miss takes the round trips of an untagged one: a read, the
    lease (whose script reads the tag clock once the lease is taken, before the load
    begins) and the write (which its tags admit). Not a round trip of its own for the
    clock. Its tag invalidated while it loads still refuses its write (the tests above)."""
    layer = make_layer(near_cache=False)
    db = Database(result=lambda key: key)
    loaders = {
        "plain": layer.cached_loader("plain:{key}")(mode.loader(db)),
        "tagged": layer.cached_loader("tagged:{key}", tags=["item:{key}", "catalog"])(mode.loader(db)),
    }

    def scripts() -> int:
        return int(redis_client.info("commandstats")["cmdstat_evalsha"]["calls"])

    for name, loader in loaders.items():
        assert mode(loader, 0) == 0  # the scripts are known to the server
        before = scripts()
        for n in range(1, 11):
            assert mode(loader, n) == n
        assert scripts() - before == 2 * 10, name  # a lease and a write each: no clock of its own
    assert layer.stats()["loads"] == 22
    assert layer.invalidate_tag("catalog") == 11
    assert layer.stats()["stale_writes_prevented"] == 0


def test_a_cold_tagged_page_writes_in_two_pipelines(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    """A cold tagged page reads the tag clock once, takes its leases in one script call,
    and writes in two pipelines: an admission for each entry, then one script writing
    every admitted value (not a script call each)."""
    layer = make_layer(near_cache=False)

    @layer.cached_loader_many("item:{item_id}", tags=["item:{item_id}", "catalog"])
    def items(item_ids: list[int]) -> dict[int, int]:
        return {id_: id_ for id_ in item_ids}

    items([0])  # the scripts are known to the server
    before = int(redis_client.info("commandstats")["cmdstat_evalsha"]["calls"])
    assert items(list(range(1, 51))) == {id_: id_ for id_ in range(1, 51)}
    calls = int(redis_client.info("commandstats")["cmdstat_evalsha"]["calls"]) - before
    assert calls == 1 + 1 + 50 + 1  # the leases, the clock, 50 admissions, one write of the 50
    assert layer.invalidate_tag("catalog") == 51
