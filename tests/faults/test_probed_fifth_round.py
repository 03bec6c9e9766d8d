"""Defects found by the fifth round of probing (issue 44), each over real servers where a
server decides it, each failing without its fix: many-key loaders that change the list
they are given, values no cache may keep, settings that cannot work together, what a
newcomer meets at decoration, and the Django backend's limits."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from stampede import NOT_MODIFIED, Cached, ConfigError, SerializationError, Stampede

from ..promises.test_behaviour import lock_is_held
from ..scenarios import wait_until

pytestmark = pytest.mark.timeout(60)


# --- 5 and 15: a many-key loader that changes the list it is given --------------------


def test_a_loader_that_sorts_its_ids_in_place_caches_each_value_under_its_own_id(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend()

    @layer.cached_loader_many("square:{n}")
    def squares(ns: list[int]) -> dict[int, int]:
        ns.sort()
        return {n: n * n for n in ns}

    assert squares([3, 1, 2]) == {3: 9, 1: 1, 2: 4}
    assert squares([1, 2, 3]) == {1: 1, 2: 4, 3: 9}  # hits, each under its own id
    assert layer.stats()["loads"] == 3 and layer.stats()["hits"] == 3

    @layer.cached_loader("square:{n}")
    def square(n: int) -> int:
        raise AssertionError("every id is cached")

    assert [square(n) for n in (1, 2, 3)] == [1, 4, 9]


@pytest.mark.parametrize("change", ["pop", "append"])
def test_a_loader_that_pops_or_appends_is_a_clear_error_and_leaves_no_lease(
    layer_of_each_backend: Callable[..., Stampede], change: str
) -> None:
    layer = layer_of_each_backend()

    @layer.cached_loader_many("changed:{n}")
    def changed(ns: list[int]) -> list[int]:
        if change == "pop":
            ns.pop()
        else:
            ns.append(99)
        return [n * 10 for n in ns]

    with pytest.raises(TypeError, match=r"many-key loader .*changed.* returned \d values for 3 ids"):
        changed([1, 2, 3])
    assert not any(lock_is_held(layer, changed.key(n)) for n in (1, 2, 3))


def test_a_loader_that_appends_and_returns_a_mapping_gets_what_it_was_asked(
    make_layer: Callable[..., Stampede],
) -> None:
    layer = make_layer()

    @layer.cached_loader_many("grown:{n}")
    def grown(ns: list[int]) -> dict[int, int]:
        ns.append(99)
        return {n: n for n in ns}

    assert grown([1, 2]) == {1: 1, 2: 2}
    assert layer._runner.store.get(grown.key(99)) is None  # type: ignore[union-attr]  # extra ids are not written


# --- 7: values that are no value --------------------------------------------------------


def test_set_refuses_not_modified_and_a_nested_cached(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer()

    @layer.cached_loader("plain:{n}")
    def plain(n: int) -> Any:
        return n

    with pytest.raises(SerializationError, match="NOT_MODIFIED answers a refresh"):
        plain.set(NOT_MODIFIED, 1)
    with pytest.raises(ValueError, match="not another Cached"):
        plain.set(Cached(Cached(5)), 1)  # type: ignore[arg-type]
    assert plain.peek(1) is None


def test_a_loader_returning_a_nested_cached_raises_and_leaves_no_lease(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer()

    @layer.cached_loader("nested:{n}")
    def nested(n: int) -> Any:
        return Cached(Cached(n))

    with pytest.raises(ValueError, match="not another Cached"):
        nested(1)
    assert not lock_is_held(layer, nested.key(1)) and nested.peek(1) is None


def test_a_loader_returning_not_modified_with_nothing_to_keep_writes_nothing(
    make_layer: Callable[..., Stampede],
) -> None:
    layer = make_layer()

    @layer.cached_loader("kept:{n}")
    def kept(n: int) -> Any:
        return NOT_MODIFIED

    with pytest.raises(ValueError, match="refreshed no value"):
        kept(1)
    assert kept.peek(1) is None and not lock_is_held(layer, kept.key(1))


# --- 16 and 26: refused at decoration, with a reason ---------------------------------


def test_a_load_timeout_longer_than_the_wait_is_refused() -> None:
    layer = Stampede()
    with pytest.raises(ConfigError, match=r"load_timeout \(40\) is longer than wait_timeout \(30"):
        layer.cached_loader("slow:{n}", load_timeout=40)
    with pytest.raises(ConfigError, match="load_timeout"):
        Stampede(load_timeout=5, wait_timeout=2)
    layer.cached_loader("slow:{n}", load_timeout=40, wait_timeout=40)  # allowed together


def test_generator_functions_are_refused_at_decoration() -> None:
    layer = Stampede()

    def rows(n: int) -> Any:
        yield n

    async def arows(n: int) -> Any:
        yield n

    for func, kind in ((rows, "a generator"), (arows, "an async generator")):
        with pytest.raises(ConfigError, match=f"{kind} function.*Return a list"):
            layer.cached_loader("g:{n}")(func)
        with pytest.raises(ConfigError, match=f"{kind} function"):
            layer.cached_loader_many("g:{n}")(func)


def test_a_decorator_called_on_the_class_says_to_make_a_layer() -> None:
    with pytest.raises(ConfigError, match=r"make one .*@layer\.cached_loader"):
        Stampede.cached_loader("k:{n}")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"@layer\.cached_loader_many"):
        Stampede.cached_loader_many("k:{n}")  # type: ignore[arg-type]


def test_a_misspelt_setting_names_the_closest_one() -> None:
    layer = Stampede()
    with pytest.raises(ConfigError, match=r"'ttll' \(did you mean 'ttl'\?\)"):
        layer.cached_loader("k:{n}", ttll=5)  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match=r"'wait_timout' \(did you mean 'wait_timeout'\?\)"):
        layer.cached_loader_many("k:{n}", wait_timout=5)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"'stale_while_revalidte' \(did you mean 'stale_while_revalidate'\?\)"):
        Stampede(stale_while_revalidte=5)
    with pytest.deprecated_call():  # the old name is still taken by both decorators
        layer.cached_loader_many("old:{n}", on_redis_error="raise")


# --- 20 and 21: the Django backend ----------------------------------------------------


django = pytest.importorskip("django", reason="Django is not installed (the dev extra installs it)")


def _django_cache(location: str, namespace: str, **options: Any) -> Any:
    from stampede.django.cache import StampedeCache

    return StampedeCache(location, {"OPTIONS": {"namespace": namespace, **options}})


def test_django_a_value_too_large_to_keep_fails_nothing_and_keeps_nothing(redis_url: str) -> None:
    """Django's own backends never fail a request for a value they cannot keep (memcached
    drops the key): ``cache_page`` on a page over ``max_value_bytes`` serves it."""
    cache = _django_cache(redis_url, "too-large", max_value_bytes=4096)
    big = "x" * 10_000
    cache.set("page", "small")
    cache.set("page", big)  # nothing raised; the old value goes
    assert cache.get("page") is None
    assert cache.get_or_set("built", lambda: big) == big
    assert cache.get("built") is None
    assert cache.add("added", big) is False

    async def main() -> list[Any]:
        await cache.aset("apage", big)
        made = await cache.aget_or_set("abuilt", lambda: big)
        return [await cache.aget("apage"), made, await cache.aget("abuilt")]

    assert asyncio.run(main()) == [None, big, None]


def test_django_incr_leaves_no_key_without_an_expiry(redis_url: str, redis_client: redis.Redis) -> None:
    """Rate limiters increment a new key per client per window: each lock's fence counter
    must go when its key does."""
    cache = _django_cache(redis_url, "counting")
    for client in range(5):
        cache.set(f"hits:{client}", 0, timeout=60)
        assert cache.incr(f"hits:{client}") == 1
    forever = [key for key in redis_client.scan_iter("counting*") if redis_client.pttl(key) == -1]
    assert forever == []


# --- 4: a tag invalidation racing another invalidation of one of its entries ---------


def test_invalidate_tag_drops_near_copies_of_members_another_invalidation_deleted_first(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    """Another invalidation (here a plain DEL, whose tracking message is still unread in
    the process that holds a near copy) deleted the entry before ``invalidate_tag`` ran:
    the tag invalidation finds nothing to drop, but must still ask the near caches, or the
    copy is served to calls begun after it returned."""
    from ..families.test_near_cache import copied, tracked

    database = {"version": 1}
    holder, invalidator = make_layer(near_cache=True, near_lease=2.0), make_layer(near_cache=True)

    def read_row(key: int) -> dict[str, int]:
        return {"key": key, "version": database["version"]}

    load = holder.cached_loader("row:{key}", tags=["rows"])(read_row)
    tracked(holder)
    copied(holder, load, 1)
    tracker: Any = holder._backend.tracker
    gate = threading.Event()
    handle = tracker._handle

    def slow_reader(*args: Any) -> Any:
        gate.wait(20)
        return handle(*args)

    tracker._handle = slow_reader
    try:
        redis_client.delete(load.key(1))  # type: ignore[attr-defined]
        database["version"] = 2
        invalidator.invalidate_tag("rows")
        assert load(1) == {"key": 1, "version": 2}, "a near copy outlived the tag invalidation"
    finally:
        gate.set()


# --- 19: the asyncio subscriber's sender outlives a connection torn down under it ------


def test_the_asyncio_subscribers_sender_survives_a_connection_torn_down_mid_send(
    make_layer: Callable[..., Stampede],
) -> None:
    """redis-py raises AttributeError from a send on a connection another task has
    disconnected. The sender must take it as a lost connection, not die with it."""
    from stampede import BackendUnavailable
    from stampede._core.keys import EntryKeys

    layer = make_layer(socket_timeout=1.0)

    async def main() -> None:
        store: Any = layer._async_runner.loop_store()  # type: ignore[union-attr]
        first = await store.subscribe(EntryKeys.for_value("test:torn:1"))
        subscriber = store._subscriber

        async def torn_down(*args: Any, **kwargs: Any) -> None:
            raise AttributeError("'NoneType' object has no attribute 'write'")

        subscriber._connection.send_command = torn_down
        with pytest.raises(BackendUnavailable):
            await store.subscribe(EntryKeys.for_value("test:torn:2"))
        sender = subscriber._sender
        assert sender is not None and sender.done()
        assert sender.exception() is None, "the sender task died with the connection"
        first.close()
        await layer.aclose()

    asyncio.run(main())


# --- 3 and 6: a store=False value -----------------------------------------------------


def _unkept_loader(
    layer: Stampede, database: dict[str, int], release: threading.Event, started: threading.Event | None = None
) -> Any:
    @layer.cached_loader("unkept:{key}", tags=["unkept"])
    def load(key: int) -> Any:
        version = database["version"]  # read when the load begins, as a query would
        if started is not None:
            started.set()
        assert release.wait(20), "the test never released the loader"
        return Cached({"key": key, "version": version}, store=False)

    return load


def test_a_store_false_value_in_flight_under_a_tag_invalidation_reaches_no_later_caller(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    """A load of an entry that is no live member of its tag is in flight; the tag is
    invalidated; a caller that begins after that waits on the lease. The load's value was
    read before the invalidation: the caller must not be handed it."""
    from ..scenarios import WaitsBegun

    first = layer_of_each_backend()
    # The embedded store is one process's: there the late caller joins the leader's flight.
    second = first if first._backend.in_process else layer_of_each_backend()
    database = {"version": 1}
    release, started = threading.Event(), threading.Event()
    load_first = _unkept_loader(first, database, release, started)
    unblocked = threading.Event()
    unblocked.set()
    load_second = load_first if second is first else _unkept_loader(second, database, unblocked)
    waits = WaitsBegun()
    second._events.add(waits)
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(load_first, 1)
        assert started.wait(20), "the first load never began"
        database["version"] = 2
        second.invalidate_tag("unkept")
        late = pool.submit(load_second, 1)
        wait_until(lambda: waits.begun >= 1, "the late caller waiting on the lease")
        release.set()
        assert leader.result(20) == {"key": 1, "version": 1}  # began before the invalidation
        late_value = late.result(20)
    assert late_value == {"key": 1, "version": 2}, "a caller begun after the tag invalidation got the old value"


def test_a_store_false_value_is_found_by_no_call_after_its_load(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend()
    loads = [0]

    @layer.cached_loader("passing:{key}")
    def passing(key: int) -> Any:
        loads[0] += 1
        return Cached(key * 10, store=False)

    for round_ in range(20):
        assert passing(1) == 10
        assert layer._runner.store.get(passing.key(1)) is None  # type: ignore[union-attr]
        assert loads[0] == round_ + 1


# --- 2: a value found on a re-check after expire() is stale --------------------------


def test_a_value_expired_before_a_waiters_re_check_is_not_fresh(make_layer: Callable[..., Stampede]) -> None:
    """A caller waits for another process's load; the load writes (its message tells the
    waiter only to re-check), then ``expire()`` returns, then the waiter re-checks and
    finds the value, now past its ttl. ``fetch()`` must not call it fresh: the waiter
    refreshes it (or serves it as stale)."""
    from stampede._core.keys import EntryKeys

    from ..scenarios import WaitsBegun
    from .test_probed_wakeups import gate_reader

    database = {"version": 1}
    options = {"ttl": 60, "stale_if_error": 60, "inline_value_limit": 0}
    loading, waiting = make_layer(**options), make_layer(**options)
    release, started = threading.Event(), threading.Event()

    def read_row(key: int) -> dict[str, int]:
        version = database["version"]
        started.set()
        assert release.wait(20), "the test never released the loader"
        return {"key": key, "version": version}

    load_a = loading.cached_loader("aging:{key}")(read_row)
    load_b = waiting.cached_loader("aging:{key}")(read_row)
    keys = EntryKeys.for_value(load_a.key(1))  # type: ignore[attr-defined]
    store_b: Any = waiting._runner.store
    earlier = store_b.subscribe(EntryKeys.for_value("test:aging:other"))  # B's subscriber connects
    subscriber = store_b._subscriber
    gate = threading.Event()
    gate_reader(subscriber._connection, gate)
    waits = WaitsBegun()
    waiting._events.add(waits)
    try:
        with ThreadPoolExecutor(2) as pool:
            holder = pool.submit(load_a, 1)
            assert started.wait(20)
            started.clear()
            waiter = pool.submit(load_b.fetch, 1)  # type: ignore[attr-defined]
            wait_until(lambda: waits.begun >= 1 and keys.channel in subscriber._channels._unconfirmed, "the wait")
            release.set()
            assert holder.result(20) == {"key": 1, "version": 1}  # written
            database["version"] = 2
            load_a.expire(1)  # type: ignore[attr-defined]
            gate.set()
            fetched = waiter.result(20)
        assert (fetched.value, fetched.stale) in (({"key": 1, "version": 2}, False), ({"key": 1, "version": 1}, True))
    finally:
        gate.set()
        earlier.close()


# --- 24: an int id too long for Python to print in decimal --------------------------


def test_a_huge_int_id_has_one_key_on_the_single_and_the_many_key_path() -> None:
    layer = Stampede(max_key_length=20_000)
    huge = 7**6000  # 5071 digits: past what str() of an int prints by default

    @layer.cached_loader("big:{n}")
    def single(n: int) -> int:
        return n % 1000

    @layer.cached_loader_many("big:{n}")
    def many(ns: list[int]) -> dict[int, int]:
        return {n: n % 1000 for n in ns}

    assert many([huge, 1]) == {huge: huge % 1000, 1: 1}
    assert single.key(huge) == many.key(huge)  # type: ignore[attr-defined]
    assert single(huge) == huge % 1000 and layer.stats()["loads"] == 2  # the many-key load's entry: a hit


# --- 26: an open circuit still names its cause ------------------------------------------


def test_check_names_the_cause_once_the_circuit_is_open() -> None:
    from stampede import BackendUnavailable
    from stampede.testing import free_port

    layer = Stampede.from_url(
        f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2, breaker_threshold=2, namespace="down"
    )
    try:
        load = layer.cached_loader("row:{n}")(lambda n: n)
        for n in range(3):
            assert load(n) == n  # served without the cache; the circuit opens
        with pytest.raises(BackendUnavailable, match=r"circuit open.*ConnectionError.*refused"):
            layer.check()
    finally:
        layer.close()


# --- 17: a load slower than wait_timeout: one fallback load per process ---------------


class WaitEnds:
    """An observer counting the waits that ended by timing out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.timed_out = 0

    def count(self, namespace: str, event: str, n: int) -> None:
        pass

    def began(self, namespace: str, measure: str) -> None:
        pass

    def ended(self, namespace: str, measure: str, outcome: str, seconds: float) -> None:
        if measure == "wait" and outcome == "timeout":
            with self._lock:
                self.timed_out += 1


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_callers_past_wait_timeout_share_one_load_per_process(make_layer: Callable[..., Stampede], kind: str) -> None:
    """Another process holds the lease and loads slowly. Ten callers here wait past
    wait_timeout: each goes on without the cache, but the process loads once."""
    holder, waiting = make_layer(), make_layer(wait_timeout=0.3)
    held, release_held, release_here = threading.Event(), threading.Event(), threading.Event()
    calls: list[str] = []

    @holder.cached_loader("slow:{n}")
    def slow_there(n: int) -> str:
        held.set()
        assert release_held.wait(30)
        return "held"

    ends = WaitEnds()
    waiting.observe(ends)
    callers = 10
    with ThreadPoolExecutor(callers + 1) as pool:
        there = pool.submit(slow_there, 1)
        assert held.wait(10)
        if kind == "blocking":

            @waiting.cached_loader("slow:{n}")
            def slow_here(n: int) -> str:
                calls.append("here")
                assert release_here.wait(30)
                return "here"

            results = [pool.submit(slow_here, 1) for _ in range(callers)]
            wait_until(lambda: ends.timed_out >= callers, "every caller timing out", 10)
            release_here.set()
            values = [result.result(20) for result in results]
        else:

            @waiting.cached_loader("slow:{n}")
            async def aslow_here(n: int) -> str:
                calls.append("here")
                while not release_here.is_set():
                    await asyncio.sleep(0.005)
                return "here"

            async def burst() -> list[str]:
                tasks = [asyncio.ensure_future(aslow_here(1)) for _ in range(callers)]
                while ends.timed_out < callers:
                    await asyncio.sleep(0.005)
                release_here.set()
                values = await asyncio.gather(*tasks)
                await waiting.aclose()
                return values

            values = asyncio.run(burst())
        release_held.set()
        assert there.result(20) == "held"
    assert values == ["here"] * callers
    assert calls == ["here"], f"{len(calls)} loads without the cache in one process"


# --- 18: load_soft_timeout holds for every caller, in every process --------------------


@pytest.mark.timing
def test_every_caller_in_every_process_serves_its_stale_value_at_the_soft_timeout(
    make_layer: Callable[..., Stampede],
) -> None:
    """One process loads slowly; four callers in each of two processes hold a stale value.
    Each serves it by ``load_soft_timeout`` after its call began, not that bound again
    after starting over (its leader's stale value was read before it joined)."""
    soft = 0.3
    options = {"ttl": 60, "stale_if_error": 60, "load_soft_timeout": soft}
    layers = [make_layer(**options), make_layer(**options)]
    release = threading.Event()
    loaders = []
    for layer in layers:

        @layer.cached_loader("soft:{n}")
        def row(n: int) -> str:
            if release.is_set():
                return "first"
            assert release.wait(30)
            return "late"

        loaders.append(row)
    release.set()
    assert loaders[0](1) == "first"
    release.clear()
    loaders[0].expire(1)  # type: ignore[attr-defined]
    per_process = 4
    barrier = threading.Barrier(2 * per_process)

    def call(load: Any) -> tuple[Any, bool, float]:
        barrier.wait(10)
        started = time.monotonic()
        fetched = load.fetch(1)
        return fetched.value, fetched.stale, time.monotonic() - started

    try:
        with ThreadPoolExecutor(2 * per_process) as pool:
            results = [pool.submit(call, load) for load in loaders for _ in range(per_process)]
            outcomes = [result.result(20) for result in results]
    finally:
        release.set()
    assert {(value, stale) for value, stale, _ in outcomes} == {("first", True)}
    slowest = max(seconds for _, _, seconds in outcomes)
    assert slowest < soft + 0.2, f"the slowest caller served its stale value after {slowest:.3f} s"


# --- 14: a cancellation redis-py drops is honoured ------------------------------------


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() tells a dropped cancellation from 3.11 on")
@pytest.mark.parametrize("many", [False, True], ids=["single-key", "many-key"])
@pytest.mark.parametrize("at", [0, 1, 2], ids=["first read", "lease", "write"])
def test_a_cancellation_dropped_inside_a_command_still_ends_the_call(
    make_layer: Callable[..., Stampede], many: bool, at: int
) -> None:
    """redis-py's asyncio client sometimes drops a cancellation that lands as a reply
    comes in, and returns the reply. Here each command of a miss (its first read, its
    lease, its write) drops one so: the call must still end cancelled, load nothing after
    it, and leave no lease behind."""
    layer = make_layer()
    calls: list[Any] = []
    if many:

        @layer.cached_loader_many("dropped-many:{n}")
        async def load(ns: list[int]) -> dict[int, int]:
            calls.append(ns)
            return {n: n for n in ns}

        def call() -> Any:
            return load([at])

    else:

        @layer.cached_loader("dropped:{n}")
        async def load(n: int) -> int:
            calls.append(n)
            return n

        def call() -> Any:
            return load(at)

    async def main() -> None:
        store: Any = layer._async_runner.loop_store()  # type: ignore[union-attr]
        sent = store._sent
        armed = [True]
        parked = asyncio.Event()

        def chosen(command: Any, args: tuple[Any, ...]) -> bool:
            """The command to drop a cancellation in: the first read, the lease script,
            or the write script (a pipeline's, for a page)."""
            stack = getattr(getattr(command, "__self__", None), "command_stack", None) or []
            words = [str(word) for entry in stack for word in entry[0]]
            words += [str(word) for arg in args for word in (arg if isinstance(arg, list) else [arg])]
            script = type(command).__name__ == "AsyncScript" or bool({"EVALSHA", "EVAL"} & set(words))
            writes = any(word.endswith(":failing") for word in words)
            return (at == 0) or (at == 1 and script and not writes) or (at == 2 and script and writes)

        async def dropping(key: str, command: Any, *args: Any, **kwargs: Any) -> Any:
            drops = armed[0] and chosen(command, args)  # before it runs: a pipeline forgets its commands
            result = await sent(key, command, *args, **kwargs)
            if drops:
                armed[0] = False
                parked.set()
                try:
                    await asyncio.sleep(1)  # the reply is in; the cancellation lands here (a shielded write ends)
                except asyncio.CancelledError:
                    pass  # and is dropped, as redis-py sometimes does
            return result

        store._sent = dropping
        task = asyncio.ensure_future(call())
        await asyncio.wait_for(parked.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        store._sent = sent
        await layer.aclose()

    asyncio.run(main())
    assert calls == ([] if at < 2 else [[at]] if many else [at])  # nothing loaded after the cancellation
    assert not lock_is_held(layer, load.key(at))  # type: ignore[attr-defined]
