"""Redis Cluster: scripts in the entry's slot, sharded wake-ups, processes, failover, slot moves.

The behaviour suite runs over the session's cluster too (``layer_of_each_backend``); the
tests here are about what a cluster adds. Tests that kill a node or move a slot start a
cluster of their own.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

import pytest
import redis
import redis.asyncio.cluster
import redis.cluster
from redis.crc import key_slot

import stampede.testing.topologies as topologies
from stampede import BackendUnavailable, ConfigError, Stampede
from stampede._backends.mailbox import LoopMailbox, ThreadMailbox
from stampede._backends.redis.shards import REHOME_PAUSES, ShardedSubscriber
from stampede._backends.redis.shards_async import AsyncShardedSubscriber
from stampede._core.keys import EntryKeys
from stampede.testing import ClusterServers, RedisServer

from ..conftest import empty_cluster
from ..modes import hammer
from ..promises.test_behaviour import CountingLoader
from ..promises.test_processes import run_stampede
from ..scenarios import WaitsBegun

pytestmark = pytest.mark.extended  # the Cluster family: CI's extended step (tests/conftest.py)


def node_client(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=5)


def shard_subscribers(cluster: ClusterServers, channel: str) -> int:
    """How many connections are subscribed to ``channel`` at the primary of its slot."""
    reply = node_client(cluster.owner(channel)).execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1])


def until(condition: Callable[[], Any], timeout: float = 10.0) -> float:
    """Poll ``condition`` until it holds (a Redis error or ``BackendUnavailable`` counts as
    not yet); return when it did (``time.monotonic()``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return time.monotonic()
        except (redis.RedisError, BackendUnavailable):
            pass
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def own_cluster() -> Iterator[ClusterServers]:
    """A cluster of three primaries with a replica each, which this test may fail over."""
    with ClusterServers(3, 1) as cluster:
        yield cluster


def test_clients_made_by_the_user_work_blocking_and_async(cluster_servers: ClusterServers) -> None:
    empty_cluster(cluster_servers)
    cluster_url = cluster_servers.url
    client = redis.cluster.RedisCluster.from_url(cluster_url, socket_timeout=5, socket_connect_timeout=5)
    layer = Stampede(
        client,
        async_client=lambda: redis.asyncio.cluster.RedisCluster.from_url(cluster_url, socket_timeout=5),
        namespace="test",
    )
    try:
        sixteen_threads_and_fifty_tasks_load_once(layer)
    finally:
        layer.close()
        client.close()


def sixteen_threads_and_fifty_tasks_load_once(layer: Stampede, after: Callable[[], Any] | None = None) -> None:
    """16 threads on one cold key load it once, then 50 tasks on another, in a loop this
    runs (``after`` is awaited in it once the layer's loop resources are closed)."""
    db = CountingLoader(delay=0.1)
    load = layer.cached_loader("item:{key}")(db)
    assert hammer(load, [1] * 16) == [{"id": 1}] * 16
    assert db.calls == {1: 1}
    calls = 0

    @layer.cached_loader("async:{key}")
    async def aload(key: int) -> dict[str, int]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.1)
        return {"key": key}

    async def main() -> list[Any]:
        try:
            return await asyncio.gather(*(aload(7) for _ in range(50)))
        finally:
            await layer.aclose()
            if after is not None:
                await after()

    assert asyncio.run(main()) == [{"key": 7}] * 50
    assert calls == 1


def test_every_key_of_an_entry_and_its_channel_share_the_entry_slot_whatever_the_arguments(
    make_cluster_layer: Callable[..., Stampede],
) -> None:
    layer = make_cluster_layer()
    db = CountingLoader()
    load = layer.cached_loader("item:{key}")(db)
    hostile = ["}", "{", "{x}", "a}{b", "{}", "}{", "{{slot}}", "x{y}z", "\x00{", "%7B"]
    for argument in hostile:
        keys = EntryKeys.for_value(load.key(argument))
        names = [keys.value, keys.lock, keys.channel, keys.invalidated, keys.failing, *keys.queue]
        assert len({key_slot(name.encode()) for name in names}) == 1, names
        # The hash tag is the whole entry: an argument cannot choose the slot of another.
        assert keys.value.count("{") == keys.value.count("}") == 1 and keys.value.endswith("}")
        assert load(argument) == {"id": argument}
        assert load(argument) == {"id": argument}
        load.invalidate(argument)
        assert load(argument) == {"id": argument}
    assert db.calls == {argument: 2 for argument in hostile}


def test_waiters_of_a_layer_share_one_sharded_subscription_and_are_woken_by_message(
    make_cluster_layer: Callable[..., Stampede], cluster_servers: ClusterServers
) -> None:
    holder_layer = make_cluster_layer()
    waiter_layer = make_cluster_layer(recheck_interval=10.0)  # a wake-up must be a message
    db = CountingLoader()
    db.release.clear()
    load_a = holder_layer.cached_loader("item:{key}")(db)
    load_b = waiter_layer.cached_loader("item:{key}")(db)
    channel = EntryKeys.for_value(load_a.key(1)).channel
    cluster = cluster_servers
    with ThreadPoolExecutor(9) as pool:
        holder = pool.submit(load_a, 1)
        assert db.started.wait(10)
        waiters = [pool.submit(load_b, 1) for _ in range(8)]
        until(lambda: shard_subscribers(cluster, channel) == 1)
        released = time.monotonic()
        db.release.set()
        assert holder.result(10) == {"id": 1}
        assert [waiter.result(10) for waiter in waiters] == [{"id": 1}] * 8
        woken_within = time.monotonic() - released
    assert db.calls == {1: 1}
    assert woken_within < 2.0  # far below recheck_interval: woken by the SPUBLISH
    assert waiter_layer.stats()["lock_waits"] == 1  # eight threads, one waiter in Redis
    until(lambda: shard_subscribers(cluster, channel) == 0)


def test_four_processes_of_sixteen_threads_load_one_cold_key_once_on_a_cluster(
    cluster_servers: ClusterServers, redis_client: redis.Redis, redis_url: str
) -> None:
    empty_cluster(cluster_servers)
    for node in cluster_servers.primaries:
        node_client(node).config_resetstat()
    results = run_stampede(
        cluster_servers.url,
        4,
        "--cluster",
        "--count-url",
        redis_url,
        "--threads",
        "16",
        "--keys",
        "1",
        "--delay",
        "0.2",
    )
    assert int(redis_client.get("calls:0") or 0) == 1
    assert sum(r["calls"] for r in results) == 64
    assert all(r["wrong"] == [] for r in results)
    # Sharded subscriptions grow with processes, not threads: at most one per waiting process.
    subscribes = sum(
        int(node_client(node).info("commandstats").get("cmdstat_ssubscribe", {}).get("calls", 0))
        for node in cluster_servers.primaries
    )
    assert subscribes <= 3


def test_two_hundred_cold_keys_spread_over_every_primary_load_two_hundred_times(
    cluster_servers: ClusterServers, redis_client: redis.Redis, redis_url: str
) -> None:
    empty_cluster(cluster_servers)
    results = run_stampede(
        cluster_servers.url, 4, "--cluster", "--count-url", redis_url, "--threads", "16", "--keys", "200",
        "--delay", "0.01",
    )  # fmt: skip
    calls = [int(redis_client.get(f"calls:{key}") or 0) for key in range(200)]
    assert calls == [1] * 200
    assert sum(r["calls"] for r in results) == 4 * 16 * 200
    assert all(r["wrong"] == [] for r in results)
    owners = {cluster_servers.owner(f"proc:{{item:{key}}}").port for key in range(200)}
    assert owners == {node.port for node in cluster_servers.primaries}  # the keys were spread


def test_a_cold_page_on_a_cluster_sends_its_scripts_and_nothing_else(
    make_cluster_layer: Callable[..., Stampede], cluster_servers: ClusterServers
) -> None:
    """redis-py's blocking cluster pipeline asks the default node COMMAND GETKEYS for each
    script it routes itself: a round trip per entry, and every page failing while that
    node is down. The store routes its scripts, so a page costs its scripts only."""
    layer = make_cluster_layer()
    page = layer.cached_loader_many("item:{item_id}")(lambda item_ids: {item: {"id": item} for item in item_ids})
    clients = [node_client(node) for node in cluster_servers.primaries]
    for client in clients:
        client.config_resetstat()
    assert page(list(range(40))) == {item: {"id": item} for item in range(40)}
    calls: collections.Counter[str] = collections.Counter()
    for client in clients:
        calls.update({name: stat["calls"] for name, stat in client.info("commandstats").items()})
    assert calls["cmdstat_command|getkeys"] == 0, calls
    assert calls["cmdstat_evalsha"] >= 2  # the page's leases and writes


def test_a_cluster_url_for_a_plain_server_is_a_config_error(redis_url: str, redis_client: redis.Redis) -> None:
    with pytest.raises(ConfigError, match="not a cluster node"):
        Stampede.from_url(redis_url, cluster=True, namespace="test")
    assert redis_client.dbsize() == 0


def test_a_cluster_nobody_answers_is_a_backend_error() -> None:
    from stampede.testing import free_port

    with pytest.raises(BackendUnavailable, match="cannot reach the cluster"):
        Stampede.from_url(f"redis://127.0.0.1:{free_port()}", cluster=True, socket_connect_timeout=0.5)


def test_named_locks_and_clear_work_on_a_cluster(make_cluster_layer: Callable[..., Stampede]) -> None:
    layer = make_cluster_layer()
    db = CountingLoader()
    load = layer.cached_loader("item:{key}")(db)
    for key in range(30):
        load(key)
    with layer.lock("report", fair=True) as held:
        assert held.fence >= 1
        assert not layer.lock("report", blocking=False).acquire()
    assert layer.clear() == 30  # SCAN over every primary
    load(3)
    assert db.calls[3] == 2


class OneAtATime:
    """One process's loader over ``db``: counts how many of its loads ran at once (``most``)."""

    def __init__(self, db: CountingLoader) -> None:
        self._db = db
        self._lock = threading.Lock()
        self._running = 0
        self.most = 0

    def __call__(self, key: int) -> Any:
        with self._lock:
            self._running += 1
            self.most = max(self.most, self._running)
        try:
            return self._db(key)
        finally:
            with self._lock:
                self._running -= 1


def start_stampede(
    layers: list[Stampede], sources: list[Callable[[int], Any]], threads_per_layer: int
) -> tuple[list[threading.Thread], list[tuple[Any, float]]]:
    """Threads of every layer call key 1 of the layer's loader over its source; returns
    them, and the list each adds its outcome (the value, or the ``BackendUnavailable`` it
    raised) and duration to."""
    outcomes: list[tuple[Any, float]] = []
    lock = threading.Lock()
    loaders = [layer.cached_loader("item:{key}")(source) for layer, source in zip(layers, sources, strict=True)]

    def call(load: Callable[[int], Any]) -> None:
        start = time.monotonic()
        try:
            outcome: Any = load(1)
        except BackendUnavailable as error:
            outcome = error
        with lock:
            outcomes.append((outcome, time.monotonic() - start))

    threads = [threading.Thread(target=call, args=(load,)) for load in loaders for _ in range(threads_per_layer)]
    for thread in threads:
        thread.start()
    return threads, outcomes


@pytest.mark.timeout(90)
@pytest.mark.parametrize("policy", ["load", "raise"])
def test_a_primary_killed_mid_stampede_fails_over_and_caching_resumes(own_cluster: ClusterServers, policy: str) -> None:
    # The holder's lock outlives the kill on the promoted replica (its release went to the
    # dead primary) until its lease ends: a lease well inside wait_timeout lets the first
    # call after the failover take over from it, not give up waiting and load uncached.
    settings = dict(namespace="test", wait_timeout=8.0, lock_ttl=3.0, on_backend_error=policy, breaker_threshold=0)
    layers = [Stampede.from_url(own_cluster.url, cluster=True, **settings) for _ in range(2)]
    try:
        db = CountingLoader(delay=0.0)
        db.release.clear()
        key_name = layers[0].cached_loader("item:{key}")(db).key(1)
        owner = own_cluster.owner(key_name)
        replica = own_cluster.replicas[own_cluster.primaries.index(owner)]
        sources = [OneAtATime(db) for _ in layers]
        loaders = [layer.cached_loader("item:{key}")(source) for layer, source in zip(layers, sources, strict=True)]
        waits = WaitsBegun()
        for layer in layers:
            layer.observe(waits)
        threads, outcomes = start_stampede(layers, list(sources), 8)
        assert db.started.wait(10)
        # Every caller is in before the kill: 7 joiners in each process, and the other
        # process's leader waiting on the holder in Redis. A caller still starting when
        # the load ended would find no flight and the primary gone, and load on its own.
        until(lambda: waits.begun == 2 * 8 - 1)
        assert sum(layer.stats()["lock_waits"] for layer in layers) == 1
        owner.kill()
        killed = time.monotonic()
        db.release.set()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads)
        own_cluster.wait_promoted(replica)
        # No caller hangs: each ended within wait_timeout plus a socket timeout of the kill.
        assert max(duration for _, duration in outcomes) < settings["wait_timeout"] + 2.0 + 3.0
        values = [outcome for outcome, _ in outcomes if not isinstance(outcome, BackendUnavailable)]
        errors = [outcome for outcome, _ in outcomes if isinstance(outcome, BackendUnavailable)]
        assert all(value == {"id": 1} for value in values)
        if policy == "load":
            assert errors == []
        assert len(values) + len(errors) == 16
        loads_during = db.total
        if policy == "raise":
            assert loads_during == 1  # the holder's: its write failed, and the rest raised
        else:
            # While the primary is down, each process loads without the cache, one load at
            # a time: its callers share one, or (those who arrived while it ran, or joined
            # the holder's unwritten load) wait for the next. How many that is depends on
            # when each caller arrives; that they never overlap does not.
            assert all(source.most == 1 for source in sources)
        # Caching resumes on the new primary. A process's first commands to the moved
        # slots may still fail until its client has learned the new owner from such a
        # failure (one command, or more if a read and a lock both go out before it asks
        # again); the policy decides those calls. Once each process has made a call with
        # no failure: one cached load in all (any other load was a failed call's: under either
        # policy a call may load and then fail to write), then hits.
        before, failed_calls = db.total, 0
        for layer, load in zip(layers, loaders, strict=True):
            for _ in range(20):
                errors = layer.stats()["redis_errors"]
                try:
                    load(1)
                except BackendUnavailable:
                    pass
                if layer.stats()["redis_errors"] == errors:
                    break
                failed_calls += 1
                time.sleep(0.1)  # a retry, bounded: the client learns the slots from a failure
            else:
                raise AssertionError("caching did not resume within 20 calls")
        assert [load(1) for load in loaders] == [{"id": 1}] * 2
        assert db.total - before <= 1 + failed_calls
        assert sum(layer.stats()["wait_timeouts"] for layer in layers) == 0
        cached = db.total
        assert [load(1) for load in loaders * 3] == [{"id": 1}] * 6
        assert db.total == cached
        assert time.monotonic() - killed < 30
        assert not node_client(own_cluster.owner(key_name)).exists(key_name + ":lock")
    finally:
        for layer in layers:
            layer.close()


@pytest.mark.timeout(60)
def test_waiters_are_still_woken_when_their_slot_moves_to_another_primary(own_cluster: ClusterServers) -> None:
    settings = dict(namespace="test", recheck_interval=10.0, lock_ttl=30.0)
    holder_layer = Stampede.from_url(own_cluster.url, cluster=True, **settings)
    waiter_layer = Stampede.from_url(own_cluster.url, cluster=True, **settings)
    try:
        db = CountingLoader()
        db.release.clear()
        load_a = holder_layer.cached_loader("item:{key}")(db)
        load_b = waiter_layer.cached_loader("item:{key}")(db)
        channel = EntryKeys.for_value(load_a.key(1)).channel
        slot = key_slot(channel.encode())
        with ThreadPoolExecutor(5) as pool:
            try:
                holder = pool.submit(load_a, 1)
                assert db.started.wait(10)
                waiters = [pool.submit(load_b, 1) for _ in range(4)]
                until(lambda: shard_subscribers(own_cluster, channel) == 1)
                old_owner = own_cluster.owner(channel)
                target = next(node for node in own_cluster.primaries if node is not old_owner)
                own_cluster.move_slot(slot, target)
                assert own_cluster.slot_owner(slot) is target
                # The old owner dropped the subscription; the waiters' subscriber follows the slot.
                until(lambda: shard_subscribers(own_cluster, channel) == 1, timeout=5)
                released = time.monotonic()
                db.release.set()
                assert holder.result(10) == {"id": 1}
                assert [waiter.result(10) for waiter in waiters] == [{"id": 1}] * 4
                woken_within = time.monotonic() - released
            finally:
                db.release.set()  # a failed assertion fails the test now, not at the 60 s timeout
        assert woken_within < 2.0  # by message, not by the 10 s re-check
        assert db.calls == {1: 1}
        assert not node_client(target).exists(load_a.key(1) + ":lock")
    finally:
        holder_layer.close()
        waiter_layer.close()


def test_a_redlock_layer_over_a_cluster_loads_once(
    make_cluster_layer: Callable[..., Stampede], make_redlock: Callable[[], Any]
) -> None:
    layer = make_cluster_layer(redlock=make_redlock())
    db = CountingLoader(delay=0.1)
    load = layer.cached_loader("item:{key}")(db)
    assert hammer(load, [1] * 16) == [{"id": 1}] * 16
    other = make_cluster_layer(redlock=make_redlock())
    assert other.cached_loader("item:{key}")(db)(1) == {"id": 1}
    assert db.calls == {1: 1}


@pytest.mark.timeout(60)
def test_a_failed_primary_opens_the_circuit_for_its_slots_only(own_cluster: ClusterServers) -> None:
    layer = Stampede.from_url(own_cluster.url, cluster=True, namespace="test", breaker_threshold=2,
                              breaker_cooldown=30.0, on_backend_error="raise")  # fmt: skip
    try:
        db = CountingLoader()
        load = layer.cached_loader("item:{key}")(db)
        victim = own_cluster.owner(load.key(0))
        elsewhere = next(key for key in range(1, 1000) if own_cluster.owner(load.key(key)) is not victim)
        victim.kill()
        for _ in range(2):
            with pytest.raises(BackendUnavailable):
                load(0)
        with pytest.raises(BackendUnavailable, match="circuit open"):
            load(0)
        # The other primaries' keys are cached as before: one load, then hits.
        assert [load(elsewhere) for _ in range(3)] == [{"id": elsewhere}] * 3
        assert db.calls == {elsewhere: 1}
        # Once the replica is promoted, its slots are served again long before the
        # 30 s cool-down: the layer asks for the slots while the circuit is open, and
        # the new primary's breaker starts closed.
        own_cluster.wait_promoted(own_cluster.replicas[own_cluster.primaries.index(victim)])
        until(lambda: load(0) == {"id": 0}, timeout=5.0)
    finally:
        layer.close()


def async_waiters_through(
    layers: tuple[Stampede, Stampede], change: Callable[[str], float]
) -> tuple[Any, list[Any], float, float, CountingLoader]:
    """A blocking holder in the first layer loads key 1 while 20 tasks of the second wait
    on it in Redis. Once they are subscribed, ``change(channel)`` runs (in a thread) and
    may move things under them; then the loader is released. Returns the holder's value,
    the tasks' values, what ``change`` returned, the seconds from the release to the last
    task's end, and the loader."""
    holder_layer, waiter_layer = layers
    db = CountingLoader()
    db.release.clear()
    load = holder_layer.cached_loader("item:{key}")(db)
    channel = EntryKeys.for_value(load.key(1)).channel

    @waiter_layer.cached_loader("item:{key}")
    async def aload(key: int) -> Any:
        return await asyncio.to_thread(db, key)

    async def main() -> tuple[Any, list[Any], float, float]:
        try:
            holder = asyncio.ensure_future(asyncio.to_thread(load, 1))
            assert await asyncio.to_thread(db.started.wait, 10)
            waiters = [asyncio.ensure_future(aload(1)) for _ in range(20)]
            await asyncio.to_thread(until, lambda: waiter_layer.stats()["lock_waits"] == 1)
            measured = await asyncio.to_thread(change, channel)
            released = time.monotonic()
            db.release.set()
            held, waited = await holder, await asyncio.gather(*waiters)
            return held, waited, measured, time.monotonic() - released
        finally:
            db.release.set()
            await waiter_layer.aclose()

    try:
        return (*asyncio.run(main()), db)
    finally:
        holder_layer.close()


@pytest.mark.timeout(60)
def test_async_waiters_are_still_woken_when_their_slot_moves_to_another_primary(own_cluster: ClusterServers) -> None:
    settings = dict(namespace="test", recheck_interval=10.0, lock_ttl=30.0)
    layers = (
        Stampede.from_url(own_cluster.url, cluster=True, **settings),
        Stampede.from_url(own_cluster.url, cluster=True, **settings),
    )

    def move_the_slot(channel: str) -> float:
        until(lambda: shard_subscribers(own_cluster, channel) == 1)
        old_owner = own_cluster.owner(channel)
        target = next(node for node in own_cluster.primaries if node is not old_owner)
        own_cluster.move_slot(key_slot(channel.encode()), target)
        until(lambda: shard_subscribers(own_cluster, channel) == 1, 5)  # the subscriber followed the slot
        return 0.0

    held, waited, _, woken_within, db = async_waiters_through(layers, move_the_slot)
    assert held == {"id": 1} and waited == [{"id": 1}] * 20
    assert woken_within < 2.0  # by message, not by the 10 s re-check
    assert db.calls == {1: 1}


def test_async_commands_beyond_max_connections_wait_for_a_connection_on_a_cluster(
    make_cluster_layer: Callable[..., Stampede],
) -> None:
    layer = make_cluster_layer(max_connections=4)
    calls: list[int] = []

    @layer.cached_loader("item:{key}")
    async def load(key: int) -> int:
        calls.append(key)
        return key

    async def main() -> tuple[list[int], list[int]]:
        try:
            first = await asyncio.gather(*(load(key) for key in range(60)))
            return first, await asyncio.gather(*(load(key) for key in range(60)))
        finally:
            await layer.aclose()

    first, second = asyncio.run(main())
    assert first == second == list(range(60))
    assert sorted(calls) == list(range(60))  # each loaded once, then hits: no command failed
    assert layer.stats()["redis_errors"] == 0


def test_a_near_cache_on_a_cluster_tracks_every_primary_and_invalidations_wait_for_it(
    make_cluster_layer: Callable[..., Stampede], cluster_servers: ClusterServers
) -> None:
    """Copies of keys on each of the three primaries: an invalidation (blocking or
    asyncio) returns only once the copy is gone, and a plain DEL on the key's primary
    (tracked there, BCAST) drops it too."""
    from ..families.test_near_cache import copied, held, tracked, versioned

    versions = dict.fromkeys(range(12), 1)
    holder = make_cluster_layer(near_cache=True)
    writer = make_cluster_layer()
    load, write = versioned(holder, versions), versioned(writer, versions)

    @writer.cached_loader("item:{key}")
    async def write_async(key: int) -> dict[str, int]:
        return {"key": key, "version": versions[key]}

    owners = {cluster_servers.owner(load.key(key)).port for key in versions}
    assert len(owners) == 3  # the keys live on every primary
    tracked(holder)
    for key in versions:
        copied(holder, load, key)
        hits = holder.stats()["near_hits"]
        assert load(key)["version"] == 1 and holder.stats()["near_hits"] == hits + 1  # from the copy
        versions[key] = 2
        if key % 2:
            write.invalidate(key)
        else:
            asyncio.run(write_async.invalidate(key))
        assert not held(holder, load.key(key)), key  # dropped before invalidate() returned
        assert load(key)["version"] == 2
    for key in versions:
        copied(holder, load, key)
        redis.Redis.from_url(cluster_servers.owner(load.key(key)).url).delete(load.key(key))
        until(lambda: not held(holder, load.key(key)), timeout=2)  # noqa: B023


@pytest.mark.timing
def test_a_near_cache_on_a_cluster_is_not_waited_for_once_closed(make_cluster_layer: Callable[..., Stampede]) -> None:
    from ..families.test_near_cache import tracked

    holder = make_cluster_layer(near_cache=True)
    tracked(holder)
    holder.close()
    load = make_cluster_layer().cached_loader("item:{key}")(lambda key: key)
    started = time.monotonic()
    load.invalidate(1)
    assert time.monotonic() - started < 0.05


@pytest.mark.timeout(90)
def test_a_near_cache_follows_a_failover_of_the_primary_its_leases_are_renewed_on(own_cluster: ClusterServers) -> None:
    """The registry's primary is killed: copies go at once (the stream is lost), the
    tracker tracks the promoted replica, and invalidations there are waited for."""
    from ..families.test_near_cache import copied, held, tracked, versioned

    settings = dict(namespace="test", breaker_threshold=0)
    holder = Stampede.from_url(own_cluster.url, cluster=True, near_cache=True, **settings)
    writer = Stampede.from_url(own_cluster.url, cluster=True, **settings)
    try:
        versions = {key: 1 for key in range(6)}
        load, write = versioned(holder, versions), versioned(writer, versions)
        home = own_cluster.owner("test:near:members")
        key = next(key for key in versions if own_cluster.owner(load.key(key)) is not home)  # readable throughout
        tracked(holder)
        copied(holder, load, key)
        flushes = holder.stats()["near_flushes"]
        home.kill()
        until(lambda: not held(holder, load.key(key)), timeout=5)
        own_cluster.wait_promoted(own_cluster.replicas[own_cluster.primaries.index(home)])
        tracked(holder, timeout=30)
        assert holder.stats()["near_flushes"] > flushes
        copied(holder, load, key)
        versions[key] = 2
        until(lambda: write.invalidate(key) is None)  # the writer may meet the dead primary first
        assert not held(holder, load.key(key))
        assert load(key)["version"] == 2
    finally:
        holder.close()
        writer.close()


class PageThroughAKill:
    """A page of 12 ids over three primaries, led by one layer while two others wait on its
    leases; once both wait, the primary of the most ids is killed and the load returns.
    Each layer stands for a process: its own client, flights and subscriber."""

    IDS: ClassVar[list[int]] = list(range(1, 13))

    def __init__(self, cluster: ClusterServers, policy: str) -> None:
        settings = dict(namespace="test", wait_timeout=8.0, on_backend_error=policy, breaker_threshold=0)
        self.layers = [Stampede.from_url(cluster.url, cluster=True, **settings) for _ in range(3)]
        self.loads: collections.Counter[int] = collections.Counter()
        self.waits = [WaitsBegun() for _ in self.layers[1:]]
        for layer, waits in zip(self.layers[1:], self.waits, strict=True):
            layer.observe(waits)
        key_of = self.layers[0].cached_loader_many("item:{item_id}")(lambda item_ids: {}).key
        self.keys = {item: key_of(item) for item in self.IDS}
        owners = collections.Counter(cluster.owner(key).port for key in self.keys.values())
        self.victim = next(node for node in cluster.primaries if node.port == owners.most_common(1)[0][0])
        self.cluster = cluster
        self.lost = [item for item in self.IDS if cluster.owner(self.keys[item]) is self.victim]
        self.kept = [item for item in self.IDS if item not in self.lost]

    def waiting(self) -> bool:
        """Whether every other layer waits on the leader (its page was read and met the
        leases: a wait begins once)."""
        return all(waits.begun >= 1 for waits in self.waits)

    def pages(self, loader_of: Callable[[bool], Callable[[list[int]], Any]]) -> list[Any]:
        """Each layer's page loader; the first layer's leads."""
        decorators = [layer.cached_loader_many("item:{item_id}") for layer in self.layers]
        return [decorate(loader_of(not index)) for index, decorate in enumerate(decorators)]

    def loaded(self, item_ids: list[int]) -> dict[int, Any]:
        self.loads.update(item_ids)
        return {item: {"id": item} for item in item_ids}

    def check(self, outcomes: list[Any], policy: str) -> None:
        page = {item: {"id": item} for item in self.IDS}
        assert outcomes[0] == page  # the holder's: loaded, whatever it could write
        for outcome in outcomes[1:]:
            assert outcome == page or (policy == "raise" and isinstance(outcome, BackendUnavailable)), outcome
        # The live primaries' ids were written and their waiters woken: one load each.
        assert {item: self.loads[item] for item in self.kept} == dict.fromkeys(self.kept, 1)
        # The dead primary's: the policy decides, at most once per process.
        most = 1 if policy == "raise" else len(self.layers)
        assert all(1 <= self.loads[item] <= most for item in self.lost), self.loads
        # Read once the cluster is whole again: between the kill and the replica's
        # promotion every node answers CLUSTERDOWN (a slow run reached this in between).
        self.cluster.wait_healthy(30.0)
        for item in self.kept:  # cached, and no lease left behind
            client = node_client(self.cluster.owner(self.keys[item]))
            assert client.exists(self.keys[item]) and not client.exists(self.keys[item] + ":lock")

    def close(self) -> None:
        for layer in self.layers:
            layer.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("policy", ["load", "raise"])
def test_a_page_in_flight_when_a_primary_dies_reloads_only_that_primarys_ids(
    own_cluster: ClusterServers, policy: str
) -> None:
    """The page's writes go to every live primary, and its waiters there are woken: the
    failure costs only what was on the dead primary (its writes; the policy's loads)."""
    run = PageThroughAKill(own_cluster, policy)
    release, started = threading.Event(), threading.Event()

    def loader_of(leads: bool) -> Callable[[list[int]], dict[int, Any]]:
        def load(item_ids: list[int]) -> dict[int, Any]:
            page = run.loaded(item_ids)
            if leads:
                started.set()
                assert release.wait(20)
            return page

        return load

    pages = run.pages(loader_of)
    try:
        with ThreadPoolExecutor(3) as pool:
            holder = pool.submit(pages[0], run.IDS)
            assert started.wait(10)
            waiters = [pool.submit(page, run.IDS) for page in pages[1:]]
            until(run.waiting)
            run.victim.kill()
            release.set()
            outcomes = [holder.result(30)]
            for waiter in waiters:
                try:
                    outcomes.append(waiter.result(30))
                except BackendUnavailable as error:
                    outcomes.append(error)
        run.check(outcomes, policy)
    finally:
        release.set()
        run.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["blocking", "asyncio"])
@pytest.mark.parametrize("fresh", [False, True], ids=["plain", "with-ttl"])
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # see the asyncio test below
def test_a_page_read_while_a_primary_is_down_serves_the_other_primaries_entries(
    own_cluster: ClusterServers, mode: str, fresh: bool
) -> None:
    """A page read fails whole in redis-py when one primary cannot be reached. Read again
    primary by primary, the live primaries' entries are hits; only the dead primary's
    fall to the policy."""
    run = PageThroughAKill(own_cluster, "load")
    options = {"stale_while_revalidate": 30.0} if fresh else {}  # reads with TTLs

    def loaded(item_ids: list[int]) -> dict[int, Any]:
        return run.loaded(list(item_ids))

    async def aloaded(item_ids: list[int]) -> dict[int, Any]:
        return run.loaded(list(item_ids))

    page = {item: {"id": item} for item in run.IDS}
    try:
        warm = run.layers[0].cached_loader_many("item:{item_id}", **options)(loaded)
        assert warm(run.IDS) == page
        reader = run.layers[1].cached_loader_many("item:{item_id}", **options)
        if mode == "blocking":
            run.loads.clear()
            run.victim.kill()
            assert reader(loaded)(run.IDS) == page
        else:
            aread = reader(aloaded)

            async def main() -> Any:
                try:
                    assert await aread(run.IDS) == page  # hits: the loop's client knows the cluster
                    run.loads.clear()
                    await asyncio.to_thread(run.victim.kill)
                    return await aread(run.IDS)
                finally:
                    await run.layers[1].aclose()

            assert asyncio.run(main()) == page
        assert dict(run.loads) == dict.fromkeys(run.lost, 1)  # the live primaries' entries were hits
    finally:
        run.close()
        gc.collect()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("policy", ["load", "raise"])
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_async_page_in_flight_when_a_primary_dies_reloads_only_that_primarys_ids(
    own_cluster: ClusterServers, policy: str
) -> None:
    """As the blocking test. redis-py's asyncio cluster pipeline, failing on one primary,
    closes the client while its other nodes' commands still run and drops those node
    objects with a connection open (redis-py 8.1): their ResourceWarnings are collected
    here, not in whichever test the garbage collector next runs in."""
    run = PageThroughAKill(own_cluster, policy)

    async def main() -> list[Any]:
        release, started = asyncio.Event(), asyncio.Event()

        def loader_of(leads: bool) -> Callable[[list[int]], Any]:
            async def load(item_ids: list[int]) -> dict[int, Any]:
                page = run.loaded(item_ids)
                if leads:
                    started.set()
                    await asyncio.wait_for(release.wait(), 20)
                return page

            return load

        pages = run.pages(loader_of)
        try:
            holder = asyncio.ensure_future(pages[0](run.IDS))
            await asyncio.wait_for(started.wait(), 10)
            waiters = [asyncio.ensure_future(page(run.IDS)) for page in pages[1:]]
            await asyncio.to_thread(until, run.waiting)
            await asyncio.to_thread(run.victim.kill)
            release.set()
            return [await holder, *await asyncio.gather(*waiters, return_exceptions=True)]
        finally:
            release.set()
            for layer in run.layers:
                await layer.aclose()

    try:
        run.check(asyncio.run(main()), policy)
    finally:
        run.close()
        gc.collect()


def test_a_node_whose_port_was_taken_meanwhile_starts_on_other_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    """A port found free can be taken before the node binds it (by another test's server,
    or a connection): the node exits at once, and the cluster starts it again elsewhere."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])  # the first port asked for is in use
    real = topologies.free_port
    monkeypatch.setattr(topologies, "free_port", lambda: next(ports, None) or real())
    try:
        with ClusterServers(1) as cluster:
            assert node_client(cluster.primaries[0]).ping()
            assert cluster.primaries[0].port != taken.getsockname()[1]
    finally:
        taken.close()


def channel_owned_elsewhere(cluster: ClusterServers, channel: str) -> str:
    """A channel whose slot another primary owns than ``channel``'s."""
    owner = cluster.owner(channel)
    return next(other for other in (f"{{other:{n}}}:ch" for n in range(1000)) if cluster.owner(other) is not owner)


def test_a_mailbox_a_primary_refuses_is_routed_to_the_slots_owner(cluster_servers: ClusterServers) -> None:
    """A mailbox moved to a primary that no longer (or not yet) owns its slot is refused
    (MOVED): it is routed again, and gets its channel's messages from the owner, rather
    than being left on the wrong connection, woken by nothing but its waiter's re-checks."""
    client = redis.cluster.RedisCluster.from_url(cluster_servers.url, socket_timeout=5)
    subscriber = ShardedSubscriber(client, timeout=5.0)
    try:
        channel = "{refused}:ch"
        wrong = subscriber._node_for(channel_owned_elsewhere(cluster_servers, channel))
        mailbox = ThreadMailbox(channel, subscriber._leave)
        with subscriber._lock:
            subscriber._homes[mailbox] = wrong
        wrong.join(mailbox, confirmed=False)  # as a move after a stale slot table does
        until(lambda: shard_subscribers(cluster_servers, channel) == 1)
        # A wake-up of the move or of the refusal may come after the message and take its
        # place (a mailbox keeps the latest): published until it is the one received.
        owner = node_client(cluster_servers.owner(channel))
        deadline = time.monotonic() + 5
        received = None
        while received != b"v2" and time.monotonic() < deadline:
            owner.execute_command("SPUBLISH", channel, "v2")
            received = mailbox.wait(0.5)
        assert received == b"v2"
        mailbox.close()
        until(lambda: shard_subscribers(cluster_servers, channel) == 0)
    finally:
        subscriber.close()
        client.close()


def test_a_mailbox_refused_again_and_again_is_left_to_its_waiters_rechecks(
    cluster_servers: ClusterServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the cluster disagrees about a slot, the moves of a refused mailbox are spaced
    and bounded: after the last, it is woken and left to its waiter's re-checks."""
    client = redis.cluster.RedisCluster.from_url(cluster_servers.url, socket_timeout=5)
    subscriber = ShardedSubscriber(client, timeout=5.0)
    try:
        channel = "{refused-again}:ch"
        elsewhere = channel_owned_elsewhere(cluster_servers, channel)
        wrong = subscriber._node_for(elsewhere)
        wrong_node = client.get_node_from_key(elsewhere)
        routed: list[str] = []

        def stale_table(key: Any, *args: Any, **kwargs: Any) -> Any:
            routed.append(key)
            return wrong_node  # every slot table asked says the wrong primary

        monkeypatch.setattr(client, "get_node_from_key", stale_table)
        mailbox = ThreadMailbox(channel, subscriber._leave)
        with subscriber._lock:
            subscriber._homes[mailbox] = wrong
        wrong.join(mailbox, confirmed=False)

        def given_up() -> bool:
            with subscriber._lock:  # a move takes the mailbox out and puts it back under it
                return mailbox not in subscriber._homes

        until(given_up, timeout=10)
        assert routed == [channel] * len(REHOME_PAUSES)
        assert mailbox.wait(0) == b""  # woken to re-check
        assert shard_subscribers(cluster_servers, channel) == 0
    finally:
        subscriber.close()
        client.close()


def test_an_async_mailbox_a_primary_refuses_is_routed_to_the_slots_owner(cluster_servers: ClusterServers) -> None:
    async def scenario() -> None:
        client = redis.asyncio.cluster.RedisCluster.from_url(cluster_servers.url, socket_timeout=5)
        subscriber = AsyncShardedSubscriber(client, timeout=5.0)
        try:
            channel = "{refused-async}:ch"
            wrong = await subscriber._node_for(channel_owned_elsewhere(cluster_servers, channel))
            mailbox = LoopMailbox(channel, asyncio.get_running_loop(), subscriber._leave)
            subscriber._homes[mailbox] = wrong
            await wrong.join(mailbox, confirmed=False)
            deadline = time.monotonic() + 10
            while shard_subscribers(cluster_servers, channel) != 1:
                assert time.monotonic() < deadline, "not routed to the slot's owner"
                await asyncio.sleep(0.01)
            await mailbox.wait(0)
            node_client(cluster_servers.owner(channel)).execute_command("SPUBLISH", channel, "v2")
            assert await mailbox.wait(5) == b"v2"
            mailbox.close()
        finally:
            await subscriber.aclose()
            await client.aclose()

    asyncio.run(scenario())
    until(lambda: shard_subscribers(cluster_servers, "{refused-async}:ch") == 0)
