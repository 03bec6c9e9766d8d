"""Defects found by probing stampede as users and adversaries would, each over a real
server: wrong data with no error, locks left held, a subscriber that died, settings and
decorations accepted that fail on every call. Each test fails without its fix."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import logging
import math
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from stampede import (
    BackendUnavailable,
    ConfigError,
    InvalidKey,
    RecursiveLoad,
    SerializationError,
    Stampede,
)
from stampede.testing import RedisServer

from ..promises.test_behaviour import CountingLoader
from ..scenarios import wait_until


def blocked_loader(result: Callable[[Any], Any] = lambda key: key) -> CountingLoader:
    """A loader that sets ``started`` and returns only once the test sets ``release``."""
    loader = CountingLoader(result)
    loader.release.clear()
    return loader


# --- 1. two loaders never share entries by accident -----------------------------------


def table_loader(layer: Stampede, table: str, template: str | None = None) -> Any:
    """A factory of loaders, one per table, as a per-tenant or per-table helper would be."""

    def load(row_id: int) -> dict[str, Any]:
        return {"table": table, "id": row_id}

    return layer.cached_loader(template)(load) if template else layer.cached_loader()(load)


def test_loaders_whose_default_keys_would_collide_are_refused_at_decoration(
    make_layer: Callable[..., Stampede],
) -> None:
    layer = make_layer()
    with pytest.raises(ConfigError, match="not a unique name.*template"):
        table_loader(layer, "users")  # made inside a function: <locals>
    with pytest.raises(ConfigError, match="lambda.*not a unique name"):
        layer.cached_loader()(lambda row_id: row_id)
    with pytest.raises(ConfigError, match="partial.*template"):
        layer.cached_loader()(functools.partial(divmod, 7))

    first = layer.cached_loader()(module_level_loader)
    assert layer.cached_loader()(module_level_loader)(3) == first(3) == 3  # the same function: fine

    def impostor(row_id: int) -> int:
        return -row_id

    impostor.__module__, impostor.__qualname__ = module_level_loader.__module__, module_level_loader.__qualname__
    with pytest.raises(ConfigError, match="already named"):
        layer.cached_loader()(impostor)


def module_level_loader(row_id: int) -> int:
    return row_id


def test_factory_loaders_with_templates_keep_their_values_apart(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer()
    users = table_loader(layer, "users", "users:{row_id}")
    orders = table_loader(layer, "orders", "orders:{row_id}")
    assert users(1) == {"table": "users", "id": 1}
    assert orders(1) == {"table": "orders", "id": 1}  # not the users row
    assert users(1) == {"table": "users", "id": 1}


# --- 2. arguments that differ never share an entry ------------------------------------


class Colour(enum.Enum):
    RED = 1


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int


def test_arguments_that_differ_get_entries_of_their_own(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer()
    calls: list[Any] = []

    @layer.cached_loader("g:{x}")
    def g(x: Any) -> int:
        calls.append(x)
        return len(calls)  # which load this was

    distinct = [None, 0, 1.0, True, "None", [1, 2], (1, 2), {"x": 1, "y": 2}, Point(1, 2), {1, 2},
                Colour.RED, uuid.UUID(int=1), b"1", 10**5000, -(10**5000)]  # fmt: skip
    for argument in distinct:
        g(argument)
    for number, argument in enumerate(distinct, 1):  # each is now a hit on its own entry
        assert g(argument) == number
    assert len(calls) == len(distinct)
    assert len({g.key(argument) for argument in distinct}) == len(distinct)

    for no_key in (math.nan, math.inf, -math.inf, [1.0, math.inf], {"x": math.nan}):
        with pytest.raises(InvalidKey, match="not a finite number"):
            g(no_key)
    assert len(calls) == len(distinct)  # refused before anything was sent or loaded


# --- 3. a write the server refuses leaves no lease behind -----------------------------


def test_a_write_the_server_refuses_releases_the_lease_and_wakes_waiters_at_once(
    own_server: RedisServer,
) -> None:
    """The write fails with OOM (maxmemory reached mid-load, noeviction): the leader still
    gets its value, the lease is released at once, and a waiter in another layer (whose
    lease and re-check are 20 s) is woken by the release, not by the lease running out."""
    admin = redis.Redis.from_url(own_server.url)
    options = dict(namespace="oom", lock_ttl=20, recheck_interval=20, wait_timeout=30)
    holder_layer, waiter_layer = (
        Stampede.from_url(own_server.url, **options),
        Stampede.from_url(own_server.url, **options),
    )
    slow = blocked_loader(lambda key: {"key": key})

    holder = holder_layer.cached_loader("item:{key}")(slow)
    waiter = waiter_layer.cached_loader("item:{key}")(lambda key: {"key": key, "by": "waiter"})
    try:
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(holder, 1)
            assert slow.started.wait(5)
            waiting = pool.submit(waiter, 1)
            wait_until(lambda: waiter_layer.stats()["lock_waits"] == 1, "the waiter to find the lease held")
            admin.set("ballast", b"x" * 4 * 1024 * 1024)
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 2 * 1024 * 1024)  # now over the limit: writes refused
            slow.release.set()
            assert held.result(5) == {"key": 1}
            assert admin.get("oom:{item:1}") is None  # refused: nothing written ...
            assert admin.exists("oom:{item:1}:lock") == 0  # ... and no lease left
            released_at = time.monotonic()
            assert waiting.result(5) == {"key": 1, "by": "waiter"}  # loaded uncached: still OOM
            assert time.monotonic() - released_at < 2.0  # woken by the release, not after 20 s
        assert holder_layer.stats()["redis_errors"] >= 1
    finally:
        admin.config_set("maxmemory", 0)
        holder_layer.close()
        waiter_layer.close()
        admin.close()


def test_durations_redis_would_refuse_are_refused_when_given() -> None:
    for bad in ({"ttl": 1e17}, {"null_ttl": 1e12}, {"lock_ttl": 1e10}, {"wait_timeout": 1e10}):
        with pytest.raises(ConfigError, match="at most"):
            Stampede(**bad)
    with pytest.raises(ConfigError, match="at most"):
        Stampede().cached_loader("x:{x}", ttl=1e17)


# --- 4. the subscriber's reader survives anything its parser raises ------------------


def test_waiters_are_woken_by_message_after_their_subscriber_connection_was_cut_from_another_thread(
    make_layer: Callable[..., Stampede],
) -> None:
    """What a send failure does: another thread disconnects the subscriber's connection
    while the reader is in a read (hiredis then raises TypeError). The reader must go on,
    reconnect and deliver the next message: the waiter's re-check is 20 s away."""
    holder_layer = make_layer(lock_ttl=20, recheck_interval=20)
    waiter_layer = make_layer(lock_ttl=20, recheck_interval=20)
    slow = blocked_loader()

    holder = holder_layer.cached_loader("cut:{key}")(slow)
    waiter = waiter_layer.cached_loader("cut:{key}")(slow)
    subscriber = waiter_layer._runner.store._subscriber  # type: ignore[union-attr]
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(holder, 1)
        assert slow.started.wait(5)
        waiting = pool.submit(waiter, 1)
        # lock_waits counts the waiter before it subscribes; cut only once the server has
        # confirmed, or the cut fails the unconfirmed subscription and the waiter gives up.
        channel = "test:{cut:1}:notify"
        channels = subscriber._channels
        wait_until(lambda: channel in channels._members and channel not in channels._unconfirmed,
                   "the waiter's subscription to be confirmed")  # fmt: skip
        for _ in range(20):  # cut it mid-read, again and again, as a failed send does
            with subscriber._lock:
                subscriber._drop_connection()
            time.sleep(0.01)
        wait_until(lambda: subscriber._connection is not None, "the subscriber to reconnect")
        wait_until(lambda: holder_layer._runner.store.client.pubsub_numsub("test:{cut:1}:notify")[0][1] == 1,  # type: ignore[union-attr]
                   "the waiter to be subscribed again")  # fmt: skip
        slow.release.set()
        assert held.result(5) == 1
        written_at = time.monotonic()
        assert waiting.result(5) == 1
        assert time.monotonic() - written_at < 1.0  # by the message, not the 20 s re-check
        assert subscriber._reader is not None and subscriber._reader.is_alive()


def test_closing_a_layer_while_its_reader_reads_raises_nothing_in_any_thread(
    make_layer: Callable[..., Stampede],
) -> None:
    """close() disconnects the subscriber while its reader is in a read: 21 of 24 closes
    printed "Exception in thread stampede-subscriber" with hiredis. Any exception in a
    thread fails the suite (warnings are errors), so running this is the assertion."""
    for round_ in range(12):
        holder_layer, waiter_layer = make_layer(), make_layer()
        slow = blocked_loader()

        holder = holder_layer.cached_loader("close:{key}")(slow)
        waiter = waiter_layer.cached_loader("close:{key}")(slow)
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(holder, round_)
            assert slow.started.wait(5)
            waiting = pool.submit(waiter, round_)
            # lock_waits counts the waiter before it subscribes: wait for the server's
            # confirmation, by which time the reader thread runs (CI once found it None).
            subscriber = waiter_layer._runner.store._subscriber  # type: ignore[union-attr]
            channel, channels = f"test:{{close:{round_}}}:notify", subscriber._channels
            wait_until(lambda c=channel, cs=channels: c in cs._members and c not in cs._unconfirmed,
                       "the waiter's subscription to be confirmed")  # fmt: skip
            reader = subscriber._reader
            waiter_layer.close()
            assert reader is not None
            reader.join(5)
            assert not reader.is_alive()
            slow.release.set()
            assert held.result(5) == round_
            assert waiting.result(10) == round_
        holder_layer.close()


# --- 5. every caller gets the same value, the leader included ------------------------


def test_values_that_do_not_round_trip_are_refused_and_the_leader_gets_what_hits_get(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer()
    calls: list[str] = []

    @layer.cached_loader("v:{kind}")
    def value(kind: str) -> Any:
        calls.append(kind)
        return {"nan": [1.0, math.nan], "inf": {"x": math.inf}, "tuple": (1, "a")}[kind]

    for kind in ("nan", "inf"):
        with pytest.raises(SerializationError, match="NaN and infinity"):
            value(kind)
        assert redis_client.get(f"test:{{v:{kind}}}") is None
        assert redis_client.exists(f"test:{{v:{kind}}}:lock") == 0  # released
    leader_got = value("tuple")
    assert leader_got == value("tuple") == [1, "a"]  # the leader too gets the list a hit gets
    assert calls == ["nan", "inf", "tuple"]


# --- 6. leases the server evicts are detected, and the policy is checked -------------


def test_a_lease_that_vanishes_mid_load_without_an_invalidation_is_counted_as_evicted(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    """The server drops the lease mid-load (what allkeys-lru does under memory pressure):
    the holder's write is refused and counted in ``evicted_leases``. An invalidation
    mid-load is refused too, but is not an eviction."""
    layer = make_layer()
    slow = blocked_loader()

    load = layer.cached_loader("ev:{key}")(slow)
    for drop, evicted in ((lambda: redis_client.delete("test:{ev:1}:lock"), 1), (lambda: load.invalidate(1), 0)):
        slow.started.clear()
        slow.release.clear()
        before = layer.stats()
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(load, 1)
            assert slow.started.wait(5)
            drop()
            slow.release.set()
            assert held.result(5) == 1
        after = layer.stats()
        assert after["stale_writes_prevented"] - before["stale_writes_prevented"] == 1
        assert after["evicted_leases"] - before["evicted_leases"] == evicted
        assert redis_client.get("test:{ev:1}") is None


@pytest.mark.parametrize("policy, warned", [("allkeys-lru", True), ("volatile-lru", True), ("noeviction", False)])
def test_a_server_that_may_evict_leases_is_warned_about_once(
    own_server: RedisServer, caplog: pytest.LogCaptureFixture, policy: str, warned: bool
) -> None:
    admin = redis.Redis.from_url(own_server.url)
    admin.config_set("maxmemory", 512 * 1024 * 1024)
    admin.config_set("maxmemory-policy", policy)
    with Stampede.from_url(own_server.url) as layer, caplog.at_level(logging.WARNING, "stampede"):
        load = layer.cached_loader("p:{key}")(lambda key: key)
        for key in range(3):  # three leases; asked once
            load(key)
        load.invalidate(0)
        load(0)
    warnings = [record.getMessage() for record in caplog.records if "maxmemory-policy" in record.getMessage()]
    assert len(warnings) == (1 if warned else 0)
    if warned:
        assert policy in warnings[0] and "noeviction" in warnings[0]
    admin.close()


# --- 7. fencing tokens keep growing, whoever clears the namespace --------------------


def test_fences_keep_growing_after_a_namespace_is_cleared_by_hand(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    layer = make_layer()
    fences = []
    for _ in range(3):
        with layer.lock("report") as lock:
            fences.append(lock.fence)
    for key in redis_client.scan_iter(match="test:*"):  # what an operator does by hand
        redis_client.delete(key)
    with layer.lock("report") as lock:
        fences.append(lock.fence)
    with layer.lock("report", fair=True) as lock:
        fences.append(lock.fence)
    assert fences == sorted(fences) and len(set(fences)) == 5


def test_clear_invalidates_every_entry_and_leaves_named_locks_alone(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend()
    calls: list[int] = []

    @layer.cached_loader("c:{key}")
    def load(key: int) -> int:
        calls.append(key)
        return key

    for key in range(5):
        load(key)
    held = layer.lock("nightly")
    assert held.acquire()
    fence = held.fence
    assert layer.clear() == 5
    for key in range(5):
        load(key)
    assert calls == [0, 1, 2, 3, 4] * 2  # every entry loaded again
    assert held.owned()  # the named lock is still held ...
    held.release()
    with layer.lock("nightly") as again:
        assert again.fence is not None and fence is not None and again.fence > fence  # ... and fences grow


# --- 8. one kind of warning never hides another --------------------------------------


def test_a_flood_of_one_warning_does_not_hide_another_kind(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    layer = make_layer(wait_timeout=0.2, on_wait_timeout="load")
    load = layer.cached_loader("w:{key}")(lambda key: key)
    with caplog.at_level(logging.WARNING, "stampede"):
        redis_client.set("test:{w:1}", b"not an envelope")
        load(1)  # an unreadable value: warned
        redis_client.set("test:{w:2}:lock", b"someone", px=5000)
        load(2)  # a wait that timed out: warned too, though within the same 10 s
    messages = [record.getMessage() for record in caplog.records]
    assert any("unreadable value" in message for message in messages)
    assert any("waited 0.2 s" in message for message in messages)


# --- 9. settings that would fail every call are refused when given -------------------


def test_settings_that_would_fail_on_every_call_are_a_config_error(redis_url: str) -> None:
    for options in ({"socket_timeout": -1}, {"socket_connect_timeout": -1}, {"socket_timeout": math.inf},
                    {"max_connections": 0}):  # fmt: skip
        with pytest.raises(ConfigError, match=next(iter(options))):
            Stampede.from_url(redis_url, **options)
    with pytest.raises(ConfigError, match="max_entries"):
        Stampede(max_entries=0)
    with pytest.raises(ConfigError, match="socket_timeout"):
        Stampede(redis.Redis.from_url(redis_url, socket_timeout=-1))


# --- 10. the decorator is used as users use decorators --------------------------------


BARE = Stampede(namespace="bare")  # embedded: module-level loaders need a layer at import


@BARE.cached_loader
def double(x: int) -> int:
    return 2 * x


class Repository:
    def __init__(self) -> None:
        self.queries = 0

    @BARE.cached_loader
    def row(self, row_id: int) -> dict[str, int]:
        self.queries += 1
        return {"id": row_id}

    @BARE.cached_loader("repo-async:{row_id}")
    async def arow(self, row_id: int) -> dict[str, int]:
        self.queries += 1
        return {"id": row_id}


def test_the_decorator_works_bare_on_functions_and_methods(make_layer: Callable[..., Stampede]) -> None:
    assert double(21) == double(21) == 42
    first, second = Repository(), Repository()
    assert first.row(1) == second.row(1) == {"id": 1}
    assert (first.queries, second.queries) == (1, 0)  # self is not part of the key
    assert first.row.key(1) == Repository.row.key(first, 1) == f"bare:{{{__name__}.Repository.row:1}}"
    first.row.invalidate(1)
    assert second.row(1) == {"id": 1} and second.queries == 1

    async def main() -> None:
        assert await first.arow(5) == await second.arow(5) == {"id": 5}

    asyncio.run(main())
    assert first.queries + second.queries == 3
    # Over Redis too, with a template where a name is not unique:
    layer = make_layer()
    remainder = layer.cached_loader("divmod:{y}")(functools.partial(divmod, 7))
    assert remainder(2) == [3, 1]  # as every later hit will read it (JSON has no tuples)
    method = layer.cached_loader(Repository.row.__wrapped__)  # type: ignore[attr-defined]
    assert method(first, 9) == {"id": 9}


# --- 11. a loader that calls itself fails at once ------------------------------------


def test_a_loader_calling_itself_for_its_own_key_fails_at_once(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(wait_timeout=30)

    @layer.cached_loader("tree:{node}")
    def tree(node: int) -> list[int]:
        return [node, *tree(node)]  # a bug: the same key again

    @layer.cached_loader("ping:{n}")
    def ping(n: int) -> int:
        return pong(n)

    @layer.cached_loader("pong:{n}")
    def pong(n: int) -> int:
        return ping(n)  # back to the key being loaded, through another loader

    @layer.cached_loader("atree:{node}")
    async def atree(node: int) -> list[int]:
        child = asyncio.ensure_future(atree(node))  # even from a task it starts
        return [node, *await child]

    started = time.monotonic()
    with pytest.raises(RecursiveLoad, match=r"'test:\{tree:1\}'"):
        tree(1)
    with pytest.raises(RecursiveLoad, match=r"'test:\{ping:2\}'"):
        ping(2)
    with pytest.raises(RecursiveLoad, match=r"'test:\{atree:3\}'"):
        asyncio.run(atree(3))
    assert time.monotonic() - started < 2.0  # not wait_timeout per level
    assert layer._runner.store.client.keys("test:*lock*") == []  # type: ignore[union-attr]


# --- 12. fail fast on a server that cannot serve as a cache --------------------------


def test_check_names_why_a_server_cannot_serve_as_the_cache(own_server: RedisServer, redis_url: str) -> None:
    with Stampede.from_url(redis_url, check=True) as healthy:
        healthy.check()

        async def acheck() -> None:
            await healthy.acheck()
            await healthy.aclose()

        asyncio.run(acheck())
    secured = RedisServer(password="secret").start()
    replica = RedisServer(args=["--replicaof", "127.0.0.1", str(own_server.port)]).start()
    try:
        wrong_password = secured.url.replace(":secret@", ":wrong@")
        with pytest.raises(BackendUnavailable, match="(?i)WRONGPASS|invalid .*password"):
            Stampede.from_url(wrong_password, check=True)
        with pytest.raises(BackendUnavailable, match="(?i)read.only"):
            Stampede.from_url(replica.url, check=True)
        layer = Stampede.from_url(replica.url)  # without check=True: fails only when asked
        with pytest.raises(BackendUnavailable, match="(?i)read.only"):
            layer.check()
        layer.close()
    finally:
        secured.stop()
        replica.stop()
