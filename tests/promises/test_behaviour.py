"""The promises of cached_loader, run over every backend, and where a promise holds for
both kinds of loader, over both (``mode``: blocking from threads, or ``async def`` as
tasks, tests/modes.py)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from stampede import SerializationError, Stampede, ValueTooLarge, WaitTimeout
from stampede._backends.memory.store import MemoryStore
from stampede._core.codec import Codec
from stampede._core.keys import EntryKeys

from ..modes import Blocking, Database, OnALoop, hammer, returning_errors


class CountingLoader(Database):
    """A fake database as a blocking loader: counts calls per key; can block until
    released (``tests/modes.py``'s ``Database``, called directly)."""

    def __call__(self, key: Any) -> Any:
        return self.load(key)


def test_a_burst_on_one_cold_key_causes_one_load(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    db = Database(delay=0.05)
    load = layer.cached_loader("item:{key}")(mode.loader(db))
    callers = 32 if mode.name == "blocking" else 1000  # a thread each, or a task each

    results = mode.burst(load, [7] * callers)

    assert db.calls == {7: 1}
    assert results == [{"id": 7}] * callers
    stats = layer.stats()
    assert stats["loads"] == 1 and stats["misses"] + stats["hits"] + stats["near_hits"] + stats["collapsed"] == callers
    if mode.name == "asyncio":  # every task starts before the leader's read returns: all join it
        assert stats["collapsed"] == callers - 1


def test_each_of_many_cold_keys_loads_once(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop, request: pytest.FixtureRequest
) -> None:
    layer = layer_of_each_backend()
    db = Database(delay=0.01)
    load = layer.cached_loader("item:{key}")(mode.loader(db))
    keys, per_key = (200, 2) if mode.name == "blocking" else (100, 5)
    if request.node.callspec.params["layer_of_each_backend"] == "zookeeper":
        # One kazoo session answers about 1,000 requests a second here, and a cold key's
        # lease is six of them: 200 keys at once queue their takes for over a second on
        # a quiet machine (p50 1.1 s), near the 2 s request timeout past which a layer
        # serves without the cache, as it should. 50 keys leave it four times that room.
        keys = 50
    asked = [k % keys for k in range(keys * per_key)]

    results = mode.burst(load, asked)

    assert db.calls == {k: 1 for k in range(keys)}
    assert results == [{"id": k} for k in asked]


def test_none_is_cached_as_the_null_sentinel_until_null_ttl(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend(null_ttl=0.5, jitter=0)
    db = Database(result=lambda key: None)
    load = layer.cached_loader("missing:{key}")(mode.loader(db))

    start = time.monotonic()
    assert mode.burst(load, [1] * 50) == [None] * 50
    assert db.calls == {1: 1}
    before = layer.stats()["null_hits"] + layer.stats()["near_hits"]
    for _ in range(20):
        assert mode(load, 1) is None
    assert db.calls == {1: 1}
    assert layer.stats()["null_hits"] + layer.stats()["near_hits"] == before + 20  # near: STAMPEDE_TEST_NEAR
    (key,) = layer.matching("missing:{key}")
    recorded = Codec().decode(layer.store().get(key) or b"").load_duration
    polls = 0
    while db.calls[1] == 1:  # the sentinel expires: the next call loads again
        assert time.monotonic() - start < 5, "null sentinel never expired"
        mode(load, 1)
        polls += 1
    # Not before null_ttl, less XFetch's head start when early_refresh is on (the suite's
    # freshness mode, conftest.py). Each hit reloads early when the load's recorded duration
    # x beta x -ln(U) reaches the time left, so over n hits a head start of
    # duration x beta x (ln n + 12) or more has odds under e**-12. A busy machine stretches
    # the recorded duration of even this microsecond loader (50 threads, one core).
    beta = layer.settings.early_refresh
    early = recorded * beta * (math.log(polls + 20) + 12) if beta else 0.0
    assert time.monotonic() - start >= 0.5 - early


def test_loader_error_reaches_every_waiter_and_nothing_is_cached(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    failing = [True]

    def result(key: Any) -> Any:
        if failing[0]:
            raise LookupError(f"database down for {key}")
        return {"id": key}

    db = Database(result=result, delay=0.05)
    load = layer.cached_loader("item:{key}")(mode.loader(db))

    outcomes = mode.burst(load, [3] * 16, errors=LookupError)

    assert db.calls == {3: 1}
    assert all(isinstance(o, LookupError) for o in outcomes)
    assert layer.stats()["loader_errors"] == 1
    assert not lock_is_held(layer, load.key(3))
    failing[0] = False
    assert mode(load, 3) == {"id": 3}  # the lock was released: the next call loads at once
    assert db.calls == {3: 2}
    assert mode(load, 3) == {"id": 3} and db.calls == {3: 2}


def test_unencodable_value_raises_and_writes_nothing(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend()
    db = CountingLoader(result=lambda key: {"tags": {1, 2}})  # a set is not JSON
    load = layer.cached_loader("item:{key}")(db)

    with pytest.raises(SerializationError) as raised:
        load(1)
    assert raised.value.key == load.key(1)
    assert "set" in str(raised.value)
    assert not lock_is_held(layer, load.key(1))
    assert layer._runner.store.get(load.key(1)) is None
    db.result = lambda key: {"tags": [1, 2]}
    assert load(1) == {"tags": [1, 2]}  # not blocked by a leftover lock
    assert db.calls == {1: 2}


def test_a_value_over_max_value_bytes_is_refused_for_every_caller_and_writes_nothing(
    layer_of_each_backend: Callable[..., Stampede],
) -> None:
    layer = layer_of_each_backend()
    db = CountingLoader(result=lambda key: "x" * 5000, delay=0.05)
    load = layer.cached_loader("item:{key}", max_value_bytes=4096)(db)

    outcomes = hammer(returning_errors(load, SerializationError), [1] * 8)

    assert all(isinstance(outcome, ValueTooLarge) for outcome in outcomes), outcomes
    error = outcomes[0]
    assert isinstance(error, SerializationError) and error.key == load.key(1)
    assert "max_value_bytes=4096" in str(error) and "nothing was written" in str(error)
    assert not lock_is_held(layer, load.key(1))
    assert layer._runner.store.get(load.key(1)) is None
    loads_before = db.calls[1]
    db.result = lambda key: "x" * 4000  # fits: 16 bytes of envelope + 4002 of JSON
    assert load(1) == "x" * 4000  # not blocked by a leftover lock
    assert load(1) == "x" * 4000 and db.calls[1] == loads_before + 1


def test_arguments_that_join_alike_are_different_entries(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend()
    calls = []

    @layer.cached_loader("u:{a}:{b}")
    def load(a: str, b: str) -> str:
        calls.append((a, b))
        return f"{a}|{b}"

    assert load("x:y", "z") == "x:y|z"
    assert load("x", "y:z") == "x|y:z"
    assert load("x:y", "z") == "x:y|z"
    assert calls == [("x:y", "z"), ("x", "y:z")]


def test_invalidate_wins_over_a_load_in_flight(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend()
    database = {"version": 1}
    db = Database(result=lambda key: dict(database))
    db.release.clear()
    load = layer.cached_loader("doc:{key}")(mode.loader(db))

    in_flight = mode.start(load, "a")
    assert db.started.wait(5)
    database["version"] = 2  # the database changes while the old load runs
    mode(load.invalidate, "a")
    db.release.set()
    assert mode(load, "a") == {"version": 2}  # a caller after the invalidate does not join the old load
    assert in_flight.result(5) == {"version": 1}  # the old load goes to its own caller only

    assert mode(load, "a") == {"version": 2}  # ...and was not written over the new value
    assert db.calls == {"a": 2}
    assert layer.stats()["stale_writes_prevented"] == 1


@pytest.mark.parametrize("policy", ["raise", "load"])
def test_a_waiter_gives_up_after_wait_timeout(layer_of_each_backend: Callable[..., Stampede], policy: str) -> None:
    layer = layer_of_each_backend(wait_timeout=0.3, on_wait_timeout=policy)
    db = CountingLoader()
    db.release.clear()
    load = layer.cached_loader("item:{key}")(db)

    with ThreadPoolExecutor(1) as pool:
        leader = pool.submit(load, 1)
        assert db.started.wait(5)
        start = time.monotonic()
        if policy == "raise":
            with pytest.raises(WaitTimeout) as raised:
                load(1)
            assert raised.value.key == load.key(1)
        else:
            waiter = threading.Thread(target=lambda: results.append(load(1)))
            results: list[Any] = []
            waiter.start()
            while db.calls[1] < 2:  # the waiter loads for itself after the timeout
                assert time.monotonic() - start < 5
                time.sleep(0.01)
            db.release.set()
            waiter.join(5)
            assert results == [{"id": 1}]
        elapsed = time.monotonic() - start
        db.release.set()
        assert leader.result(5) == {"id": 1}
    assert 0.3 <= elapsed < 2.0
    assert layer.stats()["wait_timeouts"] == 1


def test_corrupt_bytes_at_a_key_are_a_miss(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend()
    db = CountingLoader()
    load = layer.cached_loader("item:{key}")(db)
    store = layer._runner.store
    for garbage in (b"", b"\xa7S\x01\x01", b"not an envelope at all", b"\xa7S\x01\x01" + b"\0" * 12 + b"{bad json"):
        _put_raw(store, load.key(5), garbage)
        _dropped(layer, load.key(5))
        assert load(5) == {"id": 5}
        assert load(5) == {"id": 5}  # the good value replaced the garbage
    assert db.calls == {5: 4}
    assert layer.stats()["corrupt_values"] == 4


def lock_is_held(layer: Stampede, value_key: str) -> bool:
    """Whether a lease of the entry is left anywhere: on the cache server, in the embedded
    store, or (a Redlock layer) on any lock server."""
    assert layer._runner is not None
    store: Any = layer._runner.store
    servers = layer._runner.leases.servers
    if servers is not None:  # Redlock's, or ZooKeeper's
        on_servers = EntryKeys.for_value(value_key).on_lock_servers
        if any(token is not None for token in servers.holders(on_servers)):
            return True
    lock_key = value_key + ":lock"
    if hasattr(store, "client"):
        return bool(store.client.exists(lock_key))
    if isinstance(store, MemoryStore):
        return lock_key in store._leases
    return store.holder(EntryKeys.for_value(value_key)) is not None


def _dropped(layer: Stampede, key: str) -> None:
    """Wait for a near cache (STAMPEDE_TEST_NEAR) to drop its copy of ``key``, written
    behind stampede's back: its tracking message takes a moment."""
    near = layer._near
    if near is not None:
        deadline = time.monotonic() + 5
        while key in near._copies:
            assert time.monotonic() < deadline, "the near cache kept a copy of a key written elsewhere"
            time.sleep(0.001)


def _put_raw(store: Any, key: str, raw: bytes) -> None:
    store = getattr(store, "cache", store)
    if hasattr(store, "client"):
        store.client.set(key, raw)
    elif isinstance(store, MemoryStore):
        store._values[key] = (raw, time.monotonic() + 60)
    else:  # PostgreSQL
        store.get(key)  # the store makes its schema on first use: this test may be the worker's first
        with store.pool.connection() as connection:
            connection.execute(
                "INSERT INTO stampede_values (key, value, expires_at) VALUES (%s, %s, now() + interval '60 s')"
                " ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, expires_at = EXCLUDED.expires_at",
                (key, raw),
            )


def test_the_module_decorator_uses_the_default_layer(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> None:
    import stampede
    from stampede import _layer

    monkeypatch.setattr(_layer, "_default_layer", None)
    monkeypatch.delenv("STAMPEDE_REDIS_URL", raising=False)
    monkeypatch.delenv("STAMPEDE_URL", raising=False)
    db = CountingLoader()
    load = stampede.cached_loader("item:{key}")(db)
    assert load(1) == load(1) == {"id": 1}
    assert db.calls == {1: 1}
    assert type(stampede.default_layer()._runner.store).__name__ == "MemoryStore"

    for name in ("STAMPEDE_URL", "STAMPEDE_REDIS_URL"):  # the examples' and the command line's name, and the old one
        monkeypatch.setattr(_layer, "_default_layer", None)
        monkeypatch.setenv(name, redis_url)
        try:
            assert type(stampede.default_layer()._runner.store).__name__ == "RedisStore"
        finally:
            stampede.default_layer().close()
            monkeypatch.delenv(name)


def test_hostile_arguments_make_distinct_working_keys(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend()

    def tag(key: str) -> dict[str, str]:
        return {"id": key.encode("utf-8", "surrogatepass").hex()}  # JSON cannot hold a lone surrogate

    db = CountingLoader(result=tag)
    load = layer.cached_loader("user:{key}")(db)
    hostile = ["a}b{c", "x\r\nSET evil 1", "\ud800", "%3A", ":", "#", "~null", "k" * 10_000, "k" * 9_999 + "j", "", " "]

    for _ in range(2):
        assert [load(arg) for arg in hostile] == [tag(arg) for arg in hostile]

    assert db.calls == {arg: 1 for arg in hostile}
    assert len({load.key(arg) for arg in hostile}) == len(hostile)
    assert all(len(load.key(arg)) < 300 for arg in hostile)


class Interrupted(BaseException):
    """Stands for KeyboardInterrupt or a killed greenlet: not an error of the loader."""


def test_an_interrupted_leader_hands_over_to_a_waiter(layer_of_each_backend: Callable[..., Stampede]) -> None:
    layer = layer_of_each_backend()
    first_call = threading.Event()

    def result(key: Any) -> Any:
        if not first_call.is_set():
            first_call.set()
            raise Interrupted()
        return {"id": key}

    db = CountingLoader(result=result)
    db.release.clear()
    load = layer.cached_loader("item:{key}")(db)

    with ThreadPoolExecutor(5) as pool:
        leader = pool.submit(load, 1)
        assert db.started.wait(5)
        waiters = [pool.submit(load, 1) for _ in range(4)]
        while layer._runner.flights._flights[load.key(1)].done is None:
            time.sleep(0.001)  # until at least one waiter has joined
        db.release.set()
        with pytest.raises(Interrupted):
            leader.result(5)
        assert [w.result(5) for w in waiters] == [{"id": 1}] * 4  # nobody inherits the interrupt
    assert db.calls == {1: 2}
    assert not lock_is_held(layer, load.key(1))
