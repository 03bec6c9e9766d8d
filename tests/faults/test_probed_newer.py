"""Defects found by probing the newer capabilities (near cache, typed decode, freshness,
metrics, CLI, lock services) as users and adversaries would, each over real servers.
Each test fails without its fix."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from stampede import BackendUnavailable, ConfigError, InvalidKey, MsgspecSerializer, Stampede
from stampede._drivers.refresh import Refresher
from stampede.testing import FaultProxy, RedisServer, free_port

from ..promises.test_behaviour import CountingLoader
from ..promises.test_msgspec import ORDER, Order
from ..scenarios import WaitsBegun, forked_child_passes, parked_in, wait_until
from ..tools.test_cli import ROOT


def joined_by(layer: Stampede, loader: CountingLoader, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` from threads of their own: the first leads and is held in ``loader``
    until every other call has joined its flight; then all are let go."""
    joins = WaitsBegun()
    layer._events.add(joins)
    loader.release.clear()
    with ThreadPoolExecutor(len(calls)) as pool:
        leader = pool.submit(calls[0])
        assert loader.started.wait(10)
        others = [pool.submit(call) for call in calls[1:]]
        wait_until(lambda: joins.begun >= len(calls) - 1, "every caller joined the leader's flight")
        loader.release.set()
        return [leader.result(10), *(other.result(10) for other in others)]


# --- 2. near_cache=True: each caller its own object, joiners too ------------------------


def test_callers_who_join_one_read_or_load_get_objects_of_their_own(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(near_cache=True)
    loader = CountingLoader(lambda key: {"key": key, "children": [1, 2]})
    load = layer.cached_loader("tree:{key}")(loader)
    results = joined_by(layer, loader, [lambda: load(1)] * 6)
    assert loader.total == 1
    assert len({id(result) for result in results}) == 6
    results[0]["children"].append("mutated by one caller")
    assert all(result == {"key": 1, "children": [1, 2]} for result in results[1:])


def test_tasks_who_join_one_load_get_objects_of_their_own(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(near_cache=True)
    calls = [0]
    release = asyncio.Event()

    @layer.cached_loader("atree:{key}")
    async def load(key: int) -> dict[str, Any]:
        calls[0] += 1
        await release.wait()
        return {"key": key, "children": [1, 2]}

    async def main() -> list[Any]:
        joins = WaitsBegun()
        layer._events.add(joins)
        tasks = [asyncio.create_task(load(1)) for _ in range(6)]
        while joins.begun < 5:
            await asyncio.sleep(0.001)
        release.set()
        results = await asyncio.gather(*tasks)
        await layer.aclose()
        return results

    results = asyncio.run(main())
    assert calls[0] == 1 and len({id(result) for result in results}) == 6
    results[0]["children"].append("mutated by one caller")
    assert all(result == {"key": 1, "children": [1, 2]} for result in results[1:])


def test_shared_mode_still_hands_joiners_the_leaders_object(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(near_cache="shared")
    loader = CountingLoader(lambda key: {"key": key})
    load = layer.cached_loader("stree:{key}")(loader)
    results = joined_by(layer, loader, [lambda: load(1)] * 3)
    assert len({id(result) for result in results}) == 1


# --- 3. typed decode: loaders of one template never hand each other their types ----------


def as_dict(order_id: int) -> dict[str, Any]:
    return {"id": order_id}  # never called in these tests: the Order loader loads


def order_loader(layer: Stampede, loader: CountingLoader, **options: Any) -> tuple[Any, Any]:
    """Two loaders of one template and one msgspec serializer: one decodes into ``Order``,
    the other into ``dict``."""

    def typed(order_id: int) -> Order | None:
        return loader(order_id)  # type: ignore[no-any-return]

    template = "order:{order_id}"
    serializer = MsgspecSerializer()
    return (
        layer.cached_loader(template, serializer=serializer, **options)(typed),
        layer.cached_loader(template, serializer=serializer, **options)(as_dict),
    )


@pytest.mark.parametrize("near", [False, True, "shared"])
def test_a_joiner_of_another_loader_gets_its_own_type(make_layer: Callable[..., Stampede], near: Any) -> None:
    pytest.importorskip("msgspec")
    layer = make_layer(near_cache=near)
    loader = CountingLoader(lambda order_id: ORDER)
    typed, untyped = order_loader(layer, loader)
    first, second, third = joined_by(layer, loader, [lambda: typed(7), lambda: untyped(7), lambda: typed(7)])
    assert loader.total == 1
    assert first == ORDER and third == ORDER
    assert type(second) is dict and second["id"] == str(ORDER.id)


def test_a_shared_near_copy_is_decoded_again_for_another_loaders_type(make_layer: Callable[..., Stampede]) -> None:
    pytest.importorskip("msgspec")
    from ..families.test_near_cache import copied, held, tracked

    layer = make_layer(near_cache="shared")
    typed, untyped = order_loader(layer, CountingLoader(lambda order_id: ORDER))
    tracked(layer)
    copied(layer, typed, 7)
    hits = layer.stats()["near_hits"]
    value = untyped(7)
    assert type(value) is dict and value["id"] == str(ORDER.id)
    assert typed(7) is typed(7) and typed(7) == ORDER  # the typed loader's own object stays shared
    assert held(layer, typed.key(7)) and layer.stats()["near_hits"] == hits + 4


# --- 7. a failed early refresh with no stale value to serve leaves no hold ----------------


@pytest.mark.parametrize("backend", ["redis", "postgres"])
@pytest.mark.timing
def test_a_failed_early_refresh_without_a_stale_window_leaves_no_hold(
    request: pytest.FixtureRequest, backend: str
) -> None:
    make = request.getfixturevalue("make_layer" if backend == "redis" else "make_postgres_layer")
    layer: Stampede = make(stale_retry_interval=3.0, jitter=0)
    failing = threading.Event()

    def load(key: int) -> int:
        if failing.is_set():
            raise LookupError("the database is down")
        time.sleep(0.02)  # XFetch's delta: the load's duration
        return key

    cached = layer.cached_loader("early:{key}", ttl=1.0, early_refresh=100)(load)
    assert cached(1) == 1
    written = time.monotonic()
    failing.set()
    # Fresh hits, one of which (each has a chance of 1 - e**-0.5) refreshes early: it fails.
    wait_until(lambda: cached(1) == 1 and layer.stats()["refresh_errors"] >= 1, "an early refresh failed")
    time.sleep(max(0.0, written + 1.05 - time.monotonic()))  # the value's ttl has passed
    started = time.monotonic()
    with pytest.raises(LookupError):
        cached(1)
    assert time.monotonic() - started < 0.5  # no wait on a hold that serves nobody
    assert layer.stats()["takeovers"] == 0


# --- 12. globs read as Redis reads them ---------------------------------------------------

ENTRIES = ["xb", "x]", "qx]", "a[", "a]b", "ka", "kb", "k-", "k^", "zz"]


@pytest.mark.parametrize("glob", ["x[z-a]", "[^]x]", "a[[]", "a[\\]]b", "k[^a]", "k[\\^]", "k[a-b-]", "?[^z]"])
def test_a_glob_matches_what_the_server_matches(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis, glob: str
) -> None:
    layer = make_layer(namespace=f"glob-{uuid.uuid4().hex[:8]}")
    for entry in ENTRIES:
        redis_client.set(f"{layer.namespace}:{{{entry}}}", b"x")
    on_server = sorted(key.decode() for key in redis_client.scan_iter(match=f"{layer.namespace}:{{{glob}}}"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert layer.matching(glob) == on_server


@pytest.mark.parametrize(("glob", "says"), [("x[]y", "empty set"), ("a[bc", "never closed")])
def test_a_glob_that_matches_no_entry_is_an_invalid_key(
    make_layer: Callable[..., Stampede], glob: str, says: str
) -> None:
    with pytest.raises(InvalidKey, match=says):
        make_layer().matching(glob)


# --- 13. and 15. the command line: global options before demo; no password printed --------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stampede", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_the_demo_takes_global_options_before_it(redis_url: str) -> None:
    done = run_cli("--url", redis_url, "demo", "--processes", "1", "--threads", "2", "--delay", "0.01")
    assert done.returncode == 0, done.stderr
    assert f"server {redis_url}" in done.stdout and "stampede              1" in done.stdout


SECRET = "s3cret-Pw%21"


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@127.0.0.1:{free_port()}/0",  # unreachable
        f"redis://app:{SECRET}@127.0.0.1:port/0",  # malformed
        f"redis://127.0.0.1:{free_port()}/0?password={SECRET}",
        f"redis+sentinel://:{SECRET}@127.0.0.1:{free_port()}/mymaster",
    ],
    ids=["unreachable", "malformed", "query", "sentinel"],
)
def test_no_error_line_shows_the_password_of_the_url(url: str) -> None:
    done = run_cli("--url", url, "--namespace", "x", "locks")
    assert done.returncode in (1, 2) and done.stderr.count("\n") == 1, done.stderr
    assert "s3cret" not in done.stderr and "***" in done.stderr, done.stderr


def test_a_wrong_password_is_not_echoed() -> None:
    with RedisServer(password="the-right-one") as server:
        url = server.url.replace("the-right-one", SECRET)
        done = run_cli("--url", url, "locks")
    assert done.returncode == 1 and "s3cret" not in done.stderr, done.stderr
    with pytest.raises(ConfigError) as refused:
        Stampede(postgres=f"mysql://app:{SECRET}@127.0.0.1/db")
    assert "s3cret" not in str(refused.value) and "***" in str(refused.value)


# --- 14. staticmethod and classmethod loaders ----------------------------------------------


def test_static_and_class_method_loaders_in_either_order(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer()
    loads: list[str] = []

    class Shop:
        @layer.cached_loader("static-under:{shop_id}")
        @staticmethod
        def under(shop_id: int) -> int:
            loads.append("under")
            return shop_id

        @staticmethod
        @layer.cached_loader("static-over:{shop_id}")
        def over(shop_id: int) -> int:
            loads.append("over")
            return shop_id

        @classmethod
        @layer.cached_loader("class-over:{shop_id}")
        def of_class(cls, shop_id: int) -> str:
            loads.append("class")
            return f"{cls.__name__}:{shop_id}"

    for _ in range(2):
        assert Shop.under(1) == Shop().under(1) == 1
        assert Shop.over(2) == Shop().over(2) == 2
        assert Shop.of_class(3) == Shop().of_class(3) == "Shop:3"
    assert sorted(loads) == ["class", "over", "under"]
    assert Shop().under.key(1) == Shop.under.key(1) == "test:{static-under:1}"
    assert Shop.of_class.key(3) == "test:{class-over:3}"
    Shop().under.invalidate(1)
    Shop.of_class.invalidate(3)
    assert Shop.under(1) == 1 and Shop.of_class(3) == "Shop:3" and len(loads) == 5

    with pytest.raises(ConfigError, match="write @classmethod above @cached_loader"):

        class Refused:
            @layer.cached_loader("class-under:{shop_id}")  # type: ignore[arg-type]
            @classmethod
            def of_class(cls, shop_id: int) -> int:
                return shop_id


# --- 4. metrics observers survive a fork made while a thread reports ----------------------


def test_opentelemetry_metrics_in_a_child_forked_while_reporting(redis_url: str) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider

    from stampede.otel import OpenTelemetryMetrics

    metrics = OpenTelemetryMetrics(MeterProvider())
    layer = Stampede.from_url(redis_url, namespace=f"otel-{uuid.uuid4().hex[:8]}", observers=[metrics])
    try:
        load = layer.cached_loader("item:{key}")(lambda key: {"id": key})
        assert load(1) == {"id": 1}
        assert forked_child_passes(lambda: load(1) == {"id": 1}, metrics._lock)
    finally:
        layer.close()


def test_children_forked_while_threads_call_and_the_sdk_collects_all_end_cleanly(redis_url: str) -> None:
    """Probed: a fork while 3 threads called, with ``OpenTelemetryMetrics()`` observing, hung
    or failed 3 of 40 children in 1 of 5 runs. What the children inherited held was the
    SDK's own: a ``PeriodicExportingMetricReader``'s export lock held by the parent's
    reader thread mid-export (the child's exit waited for it), and the instruments'
    locks held by the parent's collection (a child's call recording a load's duration
    waited for them forever; opentelemetry-python #3307, #4345). A child records no
    durations (and says so); its calls never wait on the SDK. 40 children, forked while 3
    threads call (durations recorded) and a 4th collects, each calling twice: all end."""
    pytest.importorskip("opentelemetry.sdk")
    import os
    import signal

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from stampede.otel import OpenTelemetryMetrics

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    layer = Stampede.from_url(
        redis_url, namespace=f"otel-{uuid.uuid4().hex[:8]}", observers=[OpenTelemetryMetrics(provider)]
    )
    load = layer.cached_loader("item:{key}")(lambda key: {"id": key})
    stop = threading.Event()

    def call(key: int) -> None:
        while not stop.is_set():
            load.invalidate(key)
            load(key)

    def collect() -> None:
        while not stop.is_set():
            reader.get_metrics_data()

    threads = [threading.Thread(target=call, args=(key,)) for key in range(3)] + [threading.Thread(target=collect)]
    for thread in threads:
        thread.start()
    ended: list[int] = []
    try:
        for child in range(40):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    load.invalidate(100 + child)
                    code = 0 if load(100 + child) == load(100 + child) == {"id": 100 + child} else 1
                finally:
                    os._exit(code)
            exited: list[int] = []

            def child_exited() -> bool:
                done, status = os.waitpid(pid, os.WNOHANG)  # noqa: B023
                if done:
                    exited.append(os.waitstatus_to_exitcode(status))  # noqa: B023
                return bool(done)

            try:
                wait_until(child_exited, f"child {child} to end", timeout=20)
            finally:
                if not exited:  # hung: end it (it is ours)
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            ended += exited
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        layer.close()
        provider.shutdown()
    assert ended == [0] * 40


def test_prometheus_metrics_in_a_child_forked_while_reporting(redis_url: str) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import CollectorRegistry

    from stampede.prometheus import PrometheusMetrics

    metrics = PrometheusMetrics(CollectorRegistry())
    namespace = f"prom-{uuid.uuid4().hex[:8]}"
    layer = Stampede.from_url(redis_url, namespace=namespace, observers=[metrics])
    try:
        load = layer.cached_loader("item:{key}")(lambda key: {"id": key})
        assert load(1) == {"id": 1} and load(1) == {"id": 1}
        assert forked_child_passes(lambda: load(1) == {"id": 1}, metrics._counted[namespace, "hits"]._value._lock)
    finally:
        layer.close()


# --- 10. close() with a background refresh under way -----------------------------------------


def test_close_waits_for_a_refresh_under_way_and_leaves_no_connection(own_server: RedisServer) -> None:
    admin = redis.Redis.from_url(own_server.url)
    layer = Stampede.from_url(own_server.url, namespace="closing", jitter=0)
    loader = CountingLoader(lambda key: {"id": key})
    load = layer.cached_loader("item:{key}", ttl=0.2, stale_while_revalidate=60)(loader)
    assert load(1) == {"id": 1}
    time.sleep(0.25)  # stale now: the next hit refreshes in the background
    loader.release.clear()
    loader.started.clear()
    assert load(1) == {"id": 1}
    assert loader.started.wait(10)
    closing = threading.Thread(target=layer.close)
    closing.start()
    wait_until(lambda: parked_in(Refresher.close), "close() to wait for the refresh")
    loader.release.set()
    closing.join(10)
    assert not closing.is_alive() and loader.total == 2
    assert not [thread for thread in threading.enumerate() if thread.name == "stampede-refresh"]
    assert admin.get("closing:{item:1}:lock") is None  # the refresh wrote and released
    wait_until(lambda: len(admin.client_list()) == 1, "the layer's connections to close")
    admin.close()


# --- 8. PostgreSQL: a wake-up that would pass NOTIFY's 8000 bytes costs no write -----------


def test_postgres_caches_long_keys_and_values_and_wakes_their_waiters(make_postgres_layer: Any) -> None:
    first: Stampede = make_postgres_layer(max_key_length=500, lock_ttl=5.0)
    second: Stampede = make_postgres_layer(max_key_length=500, lock_ttl=5.0)
    loader = CountingLoader(lambda key: "v" * 4900)  # inline (under 5000 bytes), 6.5 kB in base64
    load = first.cached_loader("long:{key}")(loader)
    waiter = second.cached_loader("long:{key}")(loader)
    key = "\N{GRINNING FACE}" * 480  # 1920 bytes of UTF-8
    loader.release.clear()
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(load, key)
        assert loader.started.wait(10)
        follower = pool.submit(waiter, key)
        wait_until(lambda: second.stats()["lock_waits"] == 1, "the other layer to wait on the lease")
        started = time.monotonic()
        loader.release.set()
        assert leader.result(10) == follower.result(10) == "v" * 4900
    assert time.monotonic() - started < 2.0  # woken, not left to the 5 s lease
    assert loader.total == 1 and load(key) == "v" * 4900 and loader.total == 1  # written: a hit


def test_postgres_refuses_keys_longer_than_it_can_hold(postgres_server: Any) -> None:
    with pytest.raises(ConfigError, match="max_key_length=8100.*at most 500"):
        Stampede.from_url(postgres_server.url, max_key_length=8100)


# --- 5. Sentinel with no sentinel answering: one socket timeout per sentinel ---------------


@pytest.mark.timing
def test_with_the_sentinels_silent_a_call_costs_one_socket_timeout_per_sentinel() -> None:
    silent = [socket.socket() for _ in range(2)]  # they accept (the kernel does) and never answer
    try:
        for server in silent:
            server.bind(("127.0.0.1", 0))
            server.listen(64)
        addresses = ",".join(f"127.0.0.1:{server.getsockname()[1]}" for server in silent)
        started = time.monotonic()
        layer = Stampede.from_url(f"redis+sentinel://{addresses}/mymaster", socket_timeout=0.5, wait_timeout=1.0)
        took = {"from_url": time.monotonic() - started}
        try:
            load = layer.cached_loader("item:{key}")(lambda key: key)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "serving without the cache": the point
                for key in range(3):
                    started = time.monotonic()
                    assert load(key) == key
                    took[f"call {key}"] = time.monotonic() - started
                started = time.monotonic()
                with pytest.raises(BackendUnavailable):
                    load.invalidate(1)
                took["invalidate"] = time.monotonic() - started

                def circuit_open() -> bool:
                    load(0)  # one more failure towards breaker_threshold
                    return layer.stats()["breaker_opened"] == 1

                wait_until(circuit_open, "the circuit to open", 30)
                started = time.monotonic()
                assert [load(key) for key in range(10)] == list(range(10))
                open_circuit = time.monotonic() - started
        finally:
            layer.close()
    finally:
        for server in silent:
            server.close()
    assert max(took.values()) < 2 * 0.5 + 0.8, took  # redis-py's retries made each 7-19 s
    # With the circuit open, the sentinels are asked at most once in a while (it cost every
    # call one socket timeout per sentinel): ten calls, at most one asking.
    assert open_circuit < 2 * 0.5 + 0.6, open_circuit


# --- 1. cluster near cache: a primary cut off from this process alone ----------------------


@pytest.mark.timeout(60)
@pytest.mark.timing
def test_a_primary_cut_off_from_a_near_cache_alone_stops_its_copies(cluster_servers: Any) -> None:
    """The process reaches each primary through a proxy of its own; the proxy of a primary
    other than the registry's is stalled (packets dropped: no FIN, no RST) while other
    programs still reach that primary. A copy of a key there must stop being served
    within the lease, however the other primaries answer."""
    from redis.cluster import RedisCluster

    from ..conftest import empty_cluster
    from ..families.test_near_cache import copied, tracked, versioned

    empty_cluster(cluster_servers)
    proxies = {primary.port: FaultProxy(primary.port) for primary in cluster_servers.primaries}
    client = RedisCluster.from_url(
        cluster_servers.url,
        address_remap=lambda address: (address[0], proxies[address[1]].port if address[1] in proxies else address[1]),
        socket_timeout=0.5,
        socket_connect_timeout=0.5,
    )
    holder = Stampede(client, namespace="cut", near_cache=True, breaker_threshold=0)
    try:
        versions = dict.fromkeys(range(12), 1)
        load = versioned(holder, versions)
        home = cluster_servers.owner("cut:near:members").port
        key = next(key for key in versions if cluster_servers.owner(load.key(key)).port != home)
        tracked(holder)
        copied(holder, load, key)
        proxies[cluster_servers.owner(load.key(key)).port].stall()
        cut = time.monotonic()
        versions[key] = 2  # another program updates the database and deletes the entry
        redis.Redis.from_url(cluster_servers.owner(load.key(key)).url).delete(load.key(key))
        served = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the cut primary's reads fail open: the point
            while time.monotonic() - cut < 1.5:
                value, at = load(key), time.monotonic() - cut
                served.append((round(at, 3), value["version"]))
        stale = [at for at, version in served if version == 1 and at > 0.15]
        assert not stale, served  # at most one lease (100 ms) and a renewal after the cut
    finally:
        for proxy in proxies.values():
            proxy.flow()
        holder.close()
        client.close()
        for proxy in proxies.values():
            proxy.close()


# --- 9. ZooKeeper: a connection blip the session survives costs no write -------------------


@pytest.mark.timeout(60)
def test_a_zookeeper_connection_blip_the_session_survives_keeps_the_lease(
    zookeeper_server: Any, redis_url: str, redis_client: redis.Redis
) -> None:
    """The lease holder's connection to ZooKeeper drops (reset) and stays down for a moment
    while its loader finishes: kazoo reconnects within the session, so the lease still
    holds and the value is written, once."""
    from kazoo.client import KazooClient
    from kazoo.protocol.states import KazooState

    proxy = FaultProxy(int(zookeeper_server.hosts.rsplit(":", 1)[1]))
    client = KazooClient(
        hosts=f"127.0.0.1:{proxy.port}", timeout=10, connection_retry={"max_tries": -1, "max_delay": 0.2}
    )
    client.start(timeout=10)
    namespace = f"zk-blip-{uuid.uuid4().hex[:8]}"
    layer = Stampede.from_url(redis_url, namespace=namespace, zookeeper=client)
    loader = CountingLoader(lambda key: {"id": key})
    load = layer.cached_loader("row:{key}")(loader)
    try:
        loader.release.clear()
        with ThreadPoolExecutor(1) as pool:
            leader = pool.submit(load, 1)
            assert loader.started.wait(10)
            proxy.stall()  # reconnections hang...
            proxy.cut()  # ...after the connection is reset
            wait_until(lambda: client.state == KazooState.SUSPENDED, "kazoo to notice")
            loader.release.set()  # the write is decided while kazoo reconnects
            time.sleep(0.3)  # the outage itself: what the test is about, not a synchronisation
            proxy.flow()
            assert leader.result(20) == {"id": 1}
        assert redis_client.exists(f"{namespace}:{{row:1}}")  # written
        assert load(1) == {"id": 1} and loader.total == 1  # a hit: one load
    finally:
        proxy.flow()
        layer.close()
        client.stop()
        client.close()
        proxy.close()


# --- 6. Sentinel: a waiter long after a switch is woken on the current master --------------


@pytest.fixture
def own_sentinels() -> Any:
    from stampede.testing import SentinelServers

    with SentinelServers() as sentinels:
        yield sentinels


@pytest.mark.timeout(120)
@pytest.mark.parametrize("waits", ["blocking", "asyncio"])
@pytest.mark.timing
def test_a_waiter_long_after_a_frozen_master_was_replaced_is_woken_by_message(own_sentinels: Any, waits: str) -> None:
    """The layer's subscriber was on the old master, which froze and was replaced while
    nobody waited. Seconds later the next waiter must subscribe on the new master, and be
    woken by the holder's message, not by its lease running out. (The asyncio waiter's
    calls all run on one event loop, whose subscriber lives as long as it does.)"""
    from stampede._core.keys import EntryKeys

    from ..families.test_cluster import until
    from ..families.test_sentinel import subscribers

    settings = dict(namespace="test", lock_ttl=3.0, wait_timeout=10.0, recheck_interval=30.0, breaker_threshold=0)
    waiter, holder = (Stampede.from_url(own_sentinels.url, **settings) for _ in range(2))
    old = own_sentinels.current_master()
    paused = False
    loop = asyncio.new_event_loop()
    looping = threading.Thread(target=loop.run_forever, daemon=True)
    looping.start()
    try:
        db = CountingLoader()
        hold_with = holder.cached_loader("item:{key}")(db)
        if waits == "blocking":
            wait_on = waiter.cached_loader("item:{key}")(db)
        else:

            @waiter.cached_loader("item:{key}")
            async def wait_async(key: int) -> Any:
                return await asyncio.to_thread(db, key)

            def wait_on(key: int) -> Any:
                return asyncio.run_coroutine_threadsafe(wait_async(key), loop).result(30)

            wait_on.key = wait_async.key  # type: ignore[attr-defined]
        joined_by_other_layer(holder, waiter, db, hold_with, wait_on, 0)  # the subscriber is on the old master now
        old.pause()
        paused = True
        new = own_sentinels.wait_master_moved(old)
        time.sleep(2.0)  # "seconds later", nobody waiting meanwhile: what the test is about
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the first commands may meet the old master
            until(lambda: wait_on(1) == {"id": 1} and hold_with(2) == {"id": 2}, timeout=30)
        channel = EntryKeys.for_value(wait_on.key(3)).channel
        took = joined_by_other_layer(holder, waiter, db, hold_with, wait_on, 3, lambda: subscribers(new, channel) == 1)
        assert took < 1.0, took  # woken by message (the holder's lease had 3 s)
    finally:
        if paused:
            old.resume()
        asyncio.run_coroutine_threadsafe(waiter.aclose(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        looping.join(10)
        loop.close()
        holder.close()


def joined_by_other_layer(
    holder: Stampede,
    waiter: Stampede,
    db: CountingLoader,
    hold_with: Any,
    wait_on: Any,
    key: int,
    subscribed: Callable[[], bool] = lambda: True,
) -> float:
    """``holder`` loads ``key`` and is held in ``db`` until ``waiter`` waits on its lease
    (and ``subscribed()``); then the load ends. The seconds from then to the waiter's value."""
    from ..families.test_cluster import until

    db.release.clear()
    db.started.clear()
    waits = waiter.stats()["lock_waits"]
    with ThreadPoolExecutor(2) as pool:
        leading = pool.submit(hold_with, key)
        assert db.started.wait(10)
        waiting = pool.submit(wait_on, key)
        until(lambda: waiter.stats()["lock_waits"] > waits and subscribed(), timeout=5)
        released = time.monotonic()
        db.release.set()
        assert waiting.result(20) == {"id": key}
        took = time.monotonic() - released
        assert leading.result(20) == {"id": key}
    return took
