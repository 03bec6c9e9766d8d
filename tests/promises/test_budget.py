"""Load budgets (``max_concurrent_loads``, docs/budgets.md): at no moment more loads of a
budget than its size, counted across threads, tasks and processes, with every key still
loaded once; a load that gets no slot within wait_timeout does not run; a dead holder's
slot comes back; an unreachable store leaves each process to its own count."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from stampede import BudgetTimeout, ConfigError, Stampede
from stampede._core.keys import EntryKeys, budget_keys
from stampede._core.store import LockState, Roles, roles_of
from stampede.testing.servers import free_port

from ..modes import Blocking, OnALoop
from ..scenarios import wait_until

pytestmark = pytest.mark.timeout(60)


class Loads:
    """A database that counts the loads running at once (the peak) and each key's loads;
    every load takes ``delay`` seconds, or waits for ``release`` when it is cleared."""

    def __init__(self, delay: float = 0.02) -> None:
        self.delay = delay
        self.running = 0
        self.peak = 0
        self.calls: dict[Any, int] = {}
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self._lock = threading.Lock()

    def _begin(self, key: Any) -> None:
        with self._lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.calls[key] = self.calls.get(key, 0) + 1
        self.started.set()

    def _end(self) -> None:
        with self._lock:
            self.running -= 1

    def blocking(self, key: Any) -> Any:
        self._begin(key)
        try:
            assert self.release.wait(30), "the test never released the loader"
            time.sleep(self.delay)
            return {"id": key}
        finally:
            self._end()

    async def coroutine(self, key: Any) -> Any:
        self._begin(key)
        try:
            if not self.release.is_set():
                assert await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 30)
            await asyncio.sleep(self.delay)
            return {"id": key}
        finally:
            self._end()

    def loader(self, mode: Blocking | OnALoop) -> Callable[[Any], Any]:
        return self.blocking if isinstance(mode, Blocking) else self.coroutine


def test_a_storm_of_distinct_keys_runs_at_most_the_budgets_loads_at_once(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend(namespace=f"storm-{uuid.uuid4().hex[:8]}")
    loads = Loads()
    load = layer.cached_loader("item:{key}", max_concurrent_loads=3)(loads.loader(mode))
    keys = [index % 16 for index in range(40)]  # 16 cold keys, most called more than once
    assert mode.burst(load, keys) == [{"id": key} for key in keys]
    assert loads.calls == dict.fromkeys(range(16), 1)  # each key loaded once
    assert 2 <= loads.peak <= 3  # the budget bounds the loads at once, and they do run side by side
    assert _slots_held(layer, "item:{key}") == 0


def test_a_load_with_no_slot_within_wait_timeout_does_not_run_and_leaves_nothing_held(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    layer = layer_of_each_backend(namespace=f"starved-{uuid.uuid4().hex[:8]}")
    loads = Loads()
    load = layer.cached_loader("item:{key}", max_concurrent_loads=1, wait_timeout=0.3)(loads.loader(mode))
    loads.release.clear()
    holder = mode.start(load, "a")
    assert loads.started.wait(10)
    began = time.monotonic()
    with pytest.raises(BudgetTimeout) as raised:
        mode(load, "b")
    assert 0.25 <= time.monotonic() - began < 5
    assert raised.value.budget == "item:{key}" and loads.calls == {"a": 1}  # b's loader never ran
    assert layer.store().holder(EntryKeys.for_value(f"{layer.namespace}:{{item:b}}")) is None  # b's lease released
    loads.release.set()
    assert holder.result(10) == {"id": "a"}
    assert mode(load, "b") == {"id": "b"}  # the slot came back, and b's queue place went
    assert loads.calls == {"a": 1, "b": 1}
    assert _slots_held(layer, "item:{key}") == 0


def test_a_dead_holders_slot_comes_back_when_its_lease_runs_out(
    make_layer: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """End to end on one backend (the contract checks every store's slot expiry)."""
    layer = make_layer(namespace=f"dead-{uuid.uuid4().hex[:8]}")
    loads = Loads(delay=0.0)
    load = layer.cached_loader("item:{key}", max_concurrent_loads=1, wait_timeout=10)(loads.loader(mode))
    keys = budget_keys(layer.namespace, "item:{key}", layer.settings.max_key_length)
    assert layer.store().take_slot(keys, "a process since killed", 300, 300, 1).state is LockState.LOCKED
    began = time.monotonic()
    assert mode(load, "x") == {"id": "x"}
    assert 0.2 <= time.monotonic() - began < 5  # it waited for the dead slot's lease, not for wait_timeout


def test_a_holder_paused_past_its_slots_lease_resumes_holding_none_and_frees_none(
    make_layer: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """The bound is on slots granted (docs/budgets.md): a holder paused (SIGSTOP) past its
    slot's lease loses the slot, and the next load takes it; a loader cannot be stopped,
    so once resumed its own load may still be running beside that one. What it must not
    do is hold or free a slot: its renewal and its release are refused, and the slot stays
    the new holder's until that load returns (a third load queues meanwhile)."""
    layer = make_layer(namespace=f"paused-{uuid.uuid4().hex[:8]}")
    loads = Loads(delay=0.0)
    loads.release.clear()
    load = layer.cached_loader("item:{key}", max_concurrent_loads=1, wait_timeout=20)(loads.loader(mode))
    keys = budget_keys(layer.namespace, "item:{key}", layer.settings.max_key_length)
    store = layer.store()
    assert store.take_slot(keys, "a paused holder", 300, 300, 1).state is LockState.LOCKED
    successor = mode.start(load, "x")
    assert loads.started.wait(10)  # the paused holder's slot ran out: x's load holds it
    assert store.renew_slot(keys, "a paused holder", 10_000) is False  # resumed: it holds no slot
    assert store.release_slot(keys, "a paused holder", 1, 10_000) is False  # and frees none
    assert store.take_slot(keys, "a probe", 10_000, 0, 1).state is LockState.HELD  # still x's
    third = mode.start(load, "y")
    wait_until(lambda: layer.budget_loads().get("item:{key}", {}).get("queued") == 1, "y queued for the slot")
    assert loads.calls == {"x": 1} and loads.peak == 1
    loads.release.set()
    assert successor.result(10) == {"id": "x"} and third.result(10) == {"id": "y"}
    assert loads.peak == 1


def test_loaders_naming_one_budget_share_it_and_the_layers_budget_covers_the_rest(mode: Blocking | OnALoop) -> None:
    layer = Stampede.from_url("memory://", max_concurrent_loads=2)
    try:
        loads = Loads()
        first = layer.cached_loader("a:{key}", max_concurrent_loads=1, load_budget="db")(loads.loader(mode))
        second = layer.cached_loader("b:{key}", max_concurrent_loads=1, load_budget="db")(loads.loader(mode))
        mode.burst(lambda key: first(key) if key % 2 else second(key), list(range(12)))
        assert loads.peak == 1  # one budget of one slot for both
        layered = Loads()
        third = layer.cached_loader("c:{key}")(layered.loader(mode))
        fourth = layer.cached_loader("d:{key}")(layered.loader(mode))
        mode.burst(lambda key: third(key) if key % 2 else fourth(key), list(range(12)))
        assert 1 <= layered.peak <= 2  # the layer's budget, shared by the loaders without one
        free = Loads()
        unbudgeted = layer.cached_loader("e:{key}", max_concurrent_loads=0)(free.loader(mode))
        free.release.clear()
        futures = [mode.start(unbudgeted, key) for key in range(4)]
        deadline = time.monotonic() + 10
        while free.running < 4:  # no budget: all four run at once
            assert time.monotonic() < deadline, f"only {free.running} of 4 loads ran at once"
            time.sleep(0.01)
        free.release.set()
        assert [future.result(10) for future in futures] == [{"id": key} for key in range(4)]
    finally:
        layer.close()


def test_a_many_key_loader_takes_one_slot_per_call_not_per_id(mode: Blocking | OnALoop) -> None:
    layer = Stampede.from_url("memory://")
    try:
        loads = Loads()
        calls: list[int] = []

        if isinstance(mode, Blocking):

            def page(ids: list[int]) -> dict[int, Any]:
                calls.append(len(ids))
                return {id_: loads.blocking(id_) for id_ in ids}

        else:

            async def page(ids: list[int]) -> dict[int, Any]:  # type: ignore[misc]
                calls.append(len(ids))
                return {id_: await loads.coroutine(id_) for id_ in ids}

        many = layer.cached_loader_many("item:{id}", max_batch=5, max_concurrent_loads=1)(page)
        pages = mode.burst(many, [list(range(10)), list(range(10, 20))])  # two callers at once, two calls each
        assert pages == [{id_: {"id": id_} for id_ in ids} for ids in (range(10), range(10, 20))]
        assert calls == [5, 5, 5, 5] and loads.peak == 1  # a call of five ids held the one slot
    finally:
        layer.close()


def test_stale_values_are_served_at_once_while_their_refreshes_queue_for_a_slot(mode: Blocking | OnALoop) -> None:
    layer = Stampede.from_url("memory://", jitter=0.0)
    try:
        loads = Loads()
        load = layer.cached_loader("item:{key}", ttl=0.2, stale_while_revalidate=30, max_concurrent_loads=1)(
            loads.loader(mode)
        )
        mode.burst(load, list(range(4)))
        time.sleep(0.3)  # every value is now past its ttl, within its stale window
        loads.release.clear()  # a refresh that starts holds its slot until released
        loads.started.clear()
        began = time.monotonic()
        assert mode.burst(load, list(range(4))) == [{"id": key} for key in range(4)]  # stale, at once
        assert time.monotonic() - began < 5
        assert loads.started.wait(10)
        loads.release.set()
        deadline = time.monotonic() + 10
        while sum(loads.calls.values()) < 8 or loads.running:
            assert time.monotonic() < deadline, f"the refreshes never all ran: {loads.calls}"
            time.sleep(0.01)
        assert loads.calls == dict.fromkeys(range(4), 2) and loads.peak == 1
    finally:
        layer.close()


def test_a_loader_calling_another_of_its_budget_runs_it_in_its_own_slot(mode: Blocking | OnALoop) -> None:
    """A category's loader reads its products through their loader, both under a layer's
    budget of 2: four categories at once would each hold a slot and wait for a second one
    for ever (until wait_timeout) if a nested load took a slot of its own."""
    layer = Stampede.from_url("memory://", max_concurrent_loads=2, wait_timeout=5)
    try:
        loads = Loads(delay=0.05)
        product = layer.cached_loader("product:{key}")(loads.loader(mode))
        if isinstance(mode, Blocking):

            def category(key: int) -> list[Any]:
                return [product(key * 10 + index) for index in range(3)]

        else:

            async def category(key: int) -> list[Any]:  # type: ignore[misc]
                return [await product(key * 10 + index) for index in range(3)]

        load = layer.cached_loader("category:{key}")(category)
        began = time.monotonic()
        assert mode.burst(load, list(range(4))) == [
            [{"id": key * 10 + index} for index in range(3)] for key in range(4)
        ]
        assert time.monotonic() - began < 4  # no wait for a slot that cannot come
        assert loads.peak <= 2
    finally:
        layer.close()


def test_budgets_are_refused_at_decoration_when_they_cannot_be_kept() -> None:
    layer = Stampede.from_url("memory://")
    try:
        layer.cached_loader("a:{key}", max_concurrent_loads=2, load_budget="db")(lambda key: key)
        with pytest.raises(ConfigError, match="has 2 slots"):
            layer.cached_loader("b:{key}", max_concurrent_loads=3, load_budget="db")(lambda key: key)
        with pytest.raises(ConfigError, match="needs max_concurrent_loads"):
            layer.cached_loader("c:{key}", load_budget="other")(lambda key: key)
        with pytest.raises(ConfigError, match="max_concurrent_loads must be an integer >= 0"):
            layer.cached_loader("d:{key}", max_concurrent_loads=-1)(lambda key: key)
        with pytest.raises(ConfigError, match="load_budget must be a str"):
            layer.cached_loader("e:{key}", max_concurrent_loads=1, load_budget=7)  # type: ignore[arg-type]
    finally:
        layer.close()


def test_an_unreachable_store_leaves_each_process_to_its_own_count(mode: Blocking | OnALoop) -> None:
    """``on_backend_error="load"``: every call loads uncached, and the budget, out of the
    store's reach, is kept per process (per event loop), for all the loaders sharing it."""
    layer = Stampede.from_url(f"redis://127.0.0.1:{free_port()}/0", max_concurrent_loads=2, socket_timeout=0.5)
    try:
        loads = Loads()
        first = layer.cached_loader("a:{key}")(loads.loader(mode))
        second = layer.cached_loader("b:{key}")(loads.loader(mode))
        values = mode.burst(lambda key: first(key) if key % 2 else second(key), list(range(8)))
        assert values == [{"id": key} for key in range(8)]
        assert loads.peak <= 2 and loads.calls == dict.fromkeys(range(8), 1)
        assert layer.stats()["budget_unreachable"] >= 1
    finally:
        layer.close()


def test_the_wait_for_a_slot_is_measured_and_reported(mode: Blocking | OnALoop) -> None:
    reports: list[tuple[str, str]] = []

    class Recorder:
        def count(self, namespace: str, event: str, n: int) -> None:
            pass

        def began(self, namespace: str, measure: str) -> None:
            pass

        def ended(self, namespace: str, measure: str, outcome: str, seconds: float) -> None:
            if measure == "budget_wait":
                reports.append((outcome, namespace))

    layer = Stampede.from_url("memory://", namespace="measured", max_concurrent_loads=1, observers=[Recorder()])
    try:
        loads = Loads()
        load = layer.cached_loader("item:{key}")(loads.loader(mode))
        mode.burst(load, [1, 2, 3])
        assert reports == [("slot", "measured")] * 3
    finally:
        layer.close()


class BudgetWaits:
    """An observer of a layer: the budget waits begun so far, which a test can wait for."""

    def __init__(self) -> None:
        self._begun = 0
        self._changed = threading.Condition()

    def count(self, namespace: str, event: str, n: int) -> None:
        pass

    def began(self, namespace: str, measure: str) -> None:
        if measure == "budget_wait":
            with self._changed:
                self._begun += 1
                self._changed.notify_all()

    def ended(self, namespace: str, measure: str, outcome: str, seconds: float) -> None:
        pass

    def wait_for(self, begun: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self._begun >= begun, 10), f"{self._begun} budget waits, not {begun}"


def test_a_refresh_whose_lease_an_invalidation_took_while_it_queued_for_a_slot_does_not_load(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """A stale value's refresh takes the lease and queues for the budget's one slot; the
    key is invalidated meanwhile, which takes the lease. Loaded when the slot came, its
    value could not be written, and the next caller would load the key again: two loads
    of one entry (found by the history checker). It does not load."""
    layer = layer_of_each_backend(namespace=f"lost-{uuid.uuid4().hex[:8]}")
    waits = BudgetWaits()
    layer.observe(waits)
    loads = Loads(delay=0.0)
    load = layer.cached_loader("item:{key}", stale_while_revalidate=30, max_concurrent_loads=1, wait_timeout=10)(
        loads.loader(mode)
    )
    assert mode(load, "a") == {"id": "a"}
    mode(load.expire, "a")  # past its ttl, within its stale window
    loads.release.clear()
    loads.started.clear()
    holder = mode.start(load, "b")  # holds the budget's one slot until released
    assert loads.started.wait(10)
    assert mode(load, "a") == {"id": "a"}  # the stale value at once; its refresh queues for the slot
    waits.wait_for(3)  # a's load, b's, and the refresh's
    mode(load.invalidate, "a")
    loads.release.set()
    assert holder.result(10) == {"id": "b"}
    deadline = time.monotonic() + 10
    while layer.stats()["budget_leases_lost"] + loads.calls["a"] < 2 or loads.running:
        assert time.monotonic() < deadline, "the refresh never took its slot"
        time.sleep(0.01)
    assert mode(load, "a") == {"id": "a"}
    assert loads.calls == {"a": 2, "b": 1}  # before the invalidation, and once after it
    assert layer.stats()["budget_leases_lost"] == 1
    assert _slots_held(layer, "item:{key}") == 0


def test_a_caller_whose_lease_was_taken_while_it_queued_for_a_slot_waits_for_the_new_holder(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop, request: pytest.FixtureRequest
) -> None:
    """Two layers over one store stand for two processes. The first's caller of a cold key
    takes the lease and queues for the budget's one slot; the key is invalidated, and the
    second's caller takes the lease and queues too. When its turn comes the first loads
    nothing: it waits for the second's value, and the key is loaded once. Where the store
    grants slots by the lease (``SlotLeaseStore``) the first may learn sooner, at a
    re-check of its place, and start over before the second's caller comes: then the
    second waits for the first's load, and the key is loaded once all the same."""
    if request.node.callspec.params["layer_of_each_backend"] == "embedded":
        pytest.skip("two embedded layers share no store")
    namespace = f"lost-{uuid.uuid4().hex[:8]}"
    first, second = layer_of_each_backend(namespace=namespace), layer_of_each_backend(namespace=namespace)
    waits = BudgetWaits()  # of both layers
    first.observe(waits)
    second.observe(waits)
    loads = Loads(delay=0.0)
    settings: dict[str, Any] = {"max_concurrent_loads": 1, "wait_timeout": 10}
    first_load = first.cached_loader("item:{key}", **settings)(loads.loader(mode))
    second_load = second.cached_loader("item:{key}", **settings)(loads.loader(mode))
    loads.release.clear()
    holder = mode.start(first_load, "b")  # holds the budget's one slot until released
    assert loads.started.wait(10)
    queued = mode.start(first_load, "a")
    waits.wait_for(2)  # b's load, and the first's caller of a
    mode(first_load.invalidate, "a")
    later = mode.start(second_load, "a")
    waits.wait_for(3)  # a caller of a queued again: the second's, or the first's started over
    loads.release.set()
    assert holder.result(10) == {"id": "b"}
    assert queued.result(10) == later.result(10) == {"id": "a"}
    assert loads.calls == {"a": 1, "b": 1}
    assert first.stats()["budget_leases_lost"] == 1
    assert _slots_held(first, "item:{key}") == 0


ASKED_AFTER_THE_SLOT = {"cluster": 1, "postgres": 0, "redis": 0, "sentinel": 0, "embedded": 0}
"""Round trips a budgeted load makes to its store, between its slot and its loader, to
ask whether its lease is still its own: none where the store grants slots by the lease
(``SlotLeaseStore``), one where the budget lives elsewhere than the lease (a Cluster's
hash slot of its own)."""


def test_a_budgeted_load_asks_after_its_lease_only_where_its_store_could_not_grant_the_slot_by_it(
    layer_of_each_backend: Callable[..., Stampede], request: pytest.FixtureRequest
) -> None:
    """Where the budget's store holds the entry's lease too, the slot is granted only while
    the lease holds, and the load does not ask again: a round trip fewer between one load
    of a storm and the next. Elsewhere it asks once, after its slot. Counted at the
    store's ``renew`` (the watchdog's renewals come later than these short loads)."""
    family = request.node.callspec.params["layer_of_each_backend"]
    if family not in ASKED_AFTER_THE_SLOT:
        pytest.skip("the lease lives on lock servers: the load asks them, not the store")
    layer = layer_of_each_backend(namespace=f"asked-{uuid.uuid4().hex[:8]}", max_concurrent_loads=2)
    store = layer.store()
    asked: list[str] = []
    renew = store.renew

    def counted(keys: EntryKeys, token: str, lease_ms: int) -> bool:
        asked.append(keys.lock)
        return bool(renew(keys, token, lease_ms))

    store.renew = counted
    try:
        load = layer.cached_loader("item:{key}")(lambda key: {"id": key})
        assert [load(key) for key in "abc"] == [{"id": key} for key in "abc"]
    finally:
        del store.renew
    assert (Roles.SLOT_LEASES in roles_of(store)) is (ASKED_AFTER_THE_SLOT[family] == 0)
    assert len(asked) == 3 * ASKED_AFTER_THE_SLOT[family], asked
    assert _slots_held(layer, "item:{key}") == 0


@pytest.mark.timing
def test_processes_share_one_budget(redis_url: str, redis_client: redis.Redis) -> None:
    """Three processes of eight threads each over 48 cold keys, a budget of 4: the loads
    running at once, counted in the server by every loader, never pass 4, and each key is
    loaded once."""
    namespace = f"fleet-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    command = [sys.executable, "-m", "tests.budget_worker", redis_url, namespace, "48", "8", "4"]
    workers = [subprocess.Popen(command, env=env) for _ in range(3)]
    try:
        for worker in workers:
            assert worker.wait(60) == 0
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    loads = {int(key): int(count) for key, count in redis_client.hgetall(f"{namespace}:loads").items()}
    assert loads == dict.fromkeys(range(48), 1)
    assert 2 <= int(redis_client.get(f"{namespace}:peak") or 0) <= 4
    assert int(redis_client.get(f"{namespace}:running") or 0) == 0


def _slots_held(layer: Stampede, name: str) -> int:
    """1 if a taker of budget ``name`` finds a slot held or a place in its queue kept, 0
    when nothing is left behind (the probe's slot is given back at once)."""
    keys = budget_keys(layer.namespace, name, layer.settings.max_key_length)
    store = layer.store()
    if store.take_slot(keys, "probe", 5_000, 5_000, 1).state is LockState.LOCKED:
        store.release_slot(keys, "probe", 1, 5_000)
        return 0
    store.release_slot(keys, "probe", 1, 5_000)  # its place in the queue
    return 1


class BudgetGauges:
    """An observer that also hears of budgets (``stampede.BudgetObserver``): the loads
    queued and running per budget, as a gauge would add them up."""

    def __init__(self) -> None:
        self.now: dict[tuple[str, str], list[int]] = {}
        self.waited: dict[tuple[str, str], list[float]] = {}  # (budget, outcome) -> seconds of each wait
        self._lock = threading.Lock()

    def count(self, namespace: str, event: str, n: int) -> None:
        pass

    def began(self, namespace: str, measure: str) -> None:
        pass

    def ended(self, namespace: str, measure: str, outcome: str, seconds: float) -> None:
        pass

    def budget(self, namespace: str, budget: str, queued: int, running: int) -> None:
        with self._lock:
            now = self.now.setdefault((namespace, budget), [0, 0])
            now[0] += queued
            now[1] += running

    def budget_waited(self, namespace: str, budget: str, outcome: str, seconds: float) -> None:
        with self._lock:
            self.waited.setdefault((budget, outcome), []).append(seconds)


def test_each_budgets_loads_queued_and_running_are_told_per_budget(
    layer_of_each_backend: Callable[..., Stampede], mode: Blocking | OnALoop
) -> None:
    """Three loads of the layer's budget of one (one runs, two queue) and two of a
    loader's own budget of two (both run): ``budget_loads()``, a budget observer and the
    Prometheus gauges say so per budget, and all come back to zero when the loads end.
    Each wait for a slot is told per budget too (``budget_waited``, and the histogram
    ``stampede_budget_slot_wait_seconds``): the two that queued waited for the first."""
    namespace = f"gauged-{uuid.uuid4().hex[:8]}"
    gauges = BudgetGauges()
    layer = layer_of_each_backend(namespace=namespace, max_concurrent_loads=1, wait_timeout=20, observers=[gauges])
    prometheus = pytest.importorskip("prometheus_client")
    from stampede.prometheus import PrometheusMetrics

    registry = prometheus.CollectorRegistry()
    layer.observe(PrometheusMetrics(registry))
    loads = Loads(delay=0.0)
    loads.release.clear()
    shared = layer.cached_loader("shared:{key}")(loads.loader(mode))
    own = layer.cached_loader("own:{key}", max_concurrent_loads=2)(loads.loader(mode))
    calls = [mode.start(shared, key) for key in range(3)] + [mode.start(own, key) for key in range(3, 5)]
    expected = {"~layer": {"queued": 2, "running": 1}, "own:{key}": {"queued": 0, "running": 2}}

    def gauge(state: str, budget: str) -> float | None:
        return registry.get_sample_value(f"stampede_budget_loads_{state}", {"namespace": namespace, "budget": budget})

    def told() -> bool:
        """The layer counts a change, then tells its observers, in the thread or task that
        made it: a moment after ``budget_loads()`` changed, they have heard of it too."""
        observed = {budget: {"queued": q, "running": r} for (_, budget), (q, r) in gauges.now.items()}
        gauged = [gauge("queued", "~layer"), gauge("running", "~layer"), gauge("running", "own:{key}")]
        return layer.budget_loads() == expected and observed == expected and gauged == [2, 1, 2]

    wait_until(told, "three loads queued or running, as the layer and its observers tell", timeout=10)
    held = time.monotonic()
    time.sleep(0.05)  # the two queued loads wait at least this long for the layer's one slot
    loads.release.set()
    assert [call.result(20) for call in calls] == [{"id": key} for key in range(5)]
    waited = time.monotonic() - held
    assert sorted(gauges.waited) == [("own:{key}", "slot"), ("~layer", "slot")]
    assert len(gauges.waited["~layer", "slot"]) == 3 and len(gauges.waited["own:{key}", "slot"]) == 2
    # The two that queued waited out the hold (the first's own wait has no floor: on a busy
    # machine its slot alone may take as long, as it did in a suite run beside others).
    assert sorted(gauges.waited["~layer", "slot"])[1] >= 0.05
    assert all(seconds < waited + 1 for seconds in gauges.waited["~layer", "slot"])

    def waits(budget: str) -> float | None:
        labels = {"namespace": namespace, "budget": budget, "outcome": "slot"}
        return registry.get_sample_value("stampede_budget_slot_wait_seconds_count", labels)

    assert [waits("~layer"), waits("own:{key}")] == [3, 2]
    idle = {"queued": 0, "running": 0}
    assert layer.budget_loads() == {"~layer": idle, "own:{key}": idle}
    assert all(now == [0, 0] for now in gauges.now.values())
    assert [gauge("queued", "~layer"), gauge("running", "~layer"), gauge("running", "own:{key}")] == [0, 0, 0]
