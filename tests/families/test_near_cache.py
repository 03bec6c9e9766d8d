"""The near cache: hits with no I/O, copies dropped by every change to their key (by
stampede or anything else), the fill race, the lease, the bounds, and the promise kept
across processes: once ``invalidate()`` returned, no process serves the old value."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from stampede import ConfigError, Stampede
from stampede._core.codec import Codec
from stampede._core.config import Settings
from stampede._core.flow import LoaderSpec
from stampede._core.near import NEAR_LEASE
from stampede._core.tags import TagKeys
from stampede._drivers.near import MISSING, NearCache
from stampede._drivers.observe import Events, RateLimitedLog
from stampede.testing import CommandMonitor, FaultProxy, RedisServer

from ..families.test_cluster import until
from ..promises.test_processes import Workers

NEAR_WORKER = str(Path(__file__).parent.parent.joinpath("near_worker.py"))


def tracked(layer: Stampede, timeout: float = 10.0) -> None:
    """Wait until ``layer``'s near cache holds a live lease (its tracker started on the
    first near-cache call, or is started here)."""
    near = layer._near
    assert near is not None
    layer._backend.start_tracking()
    until(lambda: near.lease_until > time.monotonic() + 0.01, timeout)


def held(layer: Stampede, key: str) -> bool:
    near = layer._near
    assert near is not None
    return key in near._copies


def copied(layer: Stampede, load: Any, *args: Any) -> None:
    """Call ``load(*args)`` until the layer holds a copy that outlives the tracking
    messages already on their way: a read right after this process's own write is
    usually not copied (the write's message comes in while the read is on its way, and
    spoils it), or its copy is dropped when that message is read a moment later."""
    near, tracker = layer._near, layer._backend.tracker
    assert near is not None and tracker is not None

    def settled() -> bool:
        load(*args)
        if not held(layer, load.key(*args)):
            return False
        since = time.monotonic()
        until(lambda: near.lease_until > since + tracker._lease)  # a renewal sent after it: caught up
        return held(layer, load.key(*args))

    until(settled)


def held_up(layer: Stampede) -> tuple[threading.Event, threading.Event]:
    """Hold ``layer``'s tracker up at the next message it reads (as a busy process's may
    be): ``reading`` is set once it is held there, and it reads on once ``go_on`` is."""
    tracker = layer._backend.tracker
    assert tracker is not None
    handle, reading, go_on = tracker._handle, threading.Event(), threading.Event()

    def holding(reply: Any, nonces: list[str]) -> bool:
        if isinstance(reply, list) and reply and reply[0] == b"message" and not go_on.is_set():
            reading.set()
            go_on.wait(30)
        return handle(reply, nonces)

    tracker._handle = holding  # type: ignore[method-assign]
    return reading, go_on


def returned(call: Callable[..., Any], *args: Any, go_on: threading.Event) -> None:
    """Run ``call(*args)`` in a thread until it returns: if it still waits after a second
    (for this process's tracker, held up by ``held_up``), let the tracker go on."""
    calling = threading.Thread(target=call, args=args)
    calling.start()
    calling.join(1.0)
    if calling.is_alive():
        go_on.set()
        calling.join(30)
    assert not calling.is_alive()


def versioned(layer: Stampede, versions: dict[int, int], **options: Any) -> Any:
    """A loader of ``{"key": k, "version": versions[k]}``, counting its calls."""
    calls = [0]

    @layer.cached_loader("item:{key}", **options)
    def load(key: int) -> dict[str, int]:
        calls[0] += 1
        return {"key": key, "version": versions.get(key, 0)}

    load.calls = calls  # type: ignore[attr-defined]
    return load


def test_near_hits_send_nothing_to_redis(make_layer: Callable[..., Stampede], redis_url: str) -> None:
    layer = make_layer(near_cache=True)
    load = versioned(layer, {1: 1})
    tracked(layer)
    assert load(1) == {"key": 1, "version": 1}  # loaded and written
    copied(layer, load, 1)
    # Every near hit sends nothing; a call that is not one sends one GET. That is when the
    # 100 ms lease lapsed (a loaded machine can hold a renewal up past it): a round of 500
    # calls is then tried again, until one is all near hits.
    with CommandMonitor(redis_url) as monitor:
        for _ in range(5):
            hits_before = layer.stats()["near_hits"]
            for _ in range(500):
                assert load(1) == {"key": 1, "version": 1}
            sent = monitor.checkpoint()
            near_hits = layer.stats()["near_hits"] - hits_before
            reads = [command for command in sent if load.key(1) in command]
            assert reads == [("GET", load.key(1))] * (500 - near_hits)
            if near_hits == 500:
                break
            copied(layer, load, 1)
            monitor.checkpoint()  # not the reads that made the copy
    assert near_hits == 500, "no round of 500 calls was all near hits"
    stats = layer.stats()
    assert stats["loads"] == 1 and stats["near_fills"] >= 1


def test_the_near_cache_is_off_by_default(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer()
    load = versioned(layer, {1: 1})
    for _ in range(5):
        load(1)
    assert layer.stats()["near_hits"] == 0 and layer.stats()["hits"] == 4
    assert layer._backend.tracker is not None and layer._backend.tracker._thread is None  # no thread, no connection


def test_per_loader_setting_overrides_the_layer(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(near_cache=True)
    near = versioned(layer, {1: 1})
    far = layer.cached_loader("far:{key}", near_cache=False)(lambda key: {"key": key})
    tracked(layer)
    copied(layer, near, 1)
    for _ in range(3):
        far(1)
    assert not held(layer, far.key(1))


def test_each_caller_gets_an_object_of_its_own(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(near_cache=True)
    load = layer.cached_loader("tree:{key}")(lambda key: {"children": [1, 2], "key": key})
    tracked(layer)
    copied(layer, load, 1)
    first = load(1)
    first["children"].append("mutated")
    first["key"] = "mutated"
    second = load(1)
    assert second == {"children": [1, 2], "key": 1}
    assert second is not first
    assert layer.stats()["near_hits"] >= 1


def test_shared_mode_hands_every_caller_one_object(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(near_cache="shared")
    load = layer.cached_loader("tree:{key}")(lambda key: {"children": [1, 2]})
    tracked(layer)
    copied(layer, load, 1)
    assert load(1) is load(1)


def test_the_null_sentinel_is_near_cached_too(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(near_cache=True)
    calls = []
    load = layer.cached_loader("none:{key}")(lambda key: calls.append(key))
    tracked(layer)
    copied(layer, load, 1)
    hits = layer.stats()["near_hits"]
    for _ in range(10):
        assert load(1) is None
    assert calls == [1] and layer.stats()["near_hits"] == hits + 10


def test_invalidate_drops_copies_in_every_layer(make_layer: Callable[..., Stampede]) -> None:
    versions = {1: 1}
    holders = [make_layer(near_cache=True) for _ in range(3)]
    writer = make_layer()  # no near cache of its own: it must still wait for theirs
    loads = [versioned(layer, versions) for layer in holders]
    for layer in holders:
        tracked(layer)
    for layer, load in zip(holders, loads, strict=True):
        copied(layer, load, 1)
    versions[1] = 2
    versioned(writer, versions).invalidate(1)
    assert not any(held(layer, loads[0].key(1)) for layer in holders)
    assert [load(1)["version"] for load in loads] == [2, 2, 2]


def test_writes_by_anything_else_drop_copies(make_layer: Callable[..., Stampede], redis_client: redis.Redis) -> None:
    layer = make_layer(near_cache=True)
    versions = {1: 1}
    load = versioned(layer, versions)
    tracked(layer)
    key = load.key(1)

    def fill() -> None:
        copied(layer, load, 1)

    for change in (
        lambda: redis_client.set(key, b"not an envelope"),
        lambda: redis_client.delete(key),
        lambda: redis_client.pexpire(key, 100_000),
        lambda: redis_client.flushdb(),
    ):
        fill()
        change()
        until(lambda: not held(layer, key), timeout=2)
    assert layer.stats()["near_flushes"] >= 1  # FLUSHDB drops everything


def test_expire_tag_drops_this_process_s_copy_of_a_member_another_change_emptied(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    """A member whose value another change deleted first is not expired by
    ``expire_tag`` (nothing is there to expire), yet this process's copy of it may not
    have heard of that change: once ``expire_tag`` returns, the copy is gone all the same.
    (Probing found a copy served as fresh 2 and 8 ms after the return.) This process's
    tracker is held up while it reads the change's message, as a busy process's may be."""
    layer = make_layer(near_cache=True, near_lease=5, stale_while_revalidate=60)  # the lease outlives the hold-up
    versions = {1: 1}
    load = versioned(layer, versions, tags=["all"])
    tracked(layer)
    copied(layer, load, 1)
    reading, go_on = held_up(layer)
    versions[1] = 2
    redis_client.delete(load.key(1))  # a change by anything else: its message is held up
    assert reading.wait(10)
    returned(layer.expire_tag, "all", go_on=go_on)
    fetched = load.fetch(1)
    go_on.set()
    assert (fetched.value["version"], fetched.stale) != (1, False), "a copy served fresh after expire_tag returned"
    assert fetched.value["version"] == 2


def test_invalidate_tag_drops_the_copy_of_a_member_an_earlier_one_deleted_and_forgot(
    make_layer: Callable[..., Stampede], redis_client: redis.Redis
) -> None:
    """An earlier tag invalidation deleted a member and dropped it from the tag, then
    failed (or its process died) before it asked the near caches. The next tag
    invalidation finds no member, yet this process's copy of it may not have heard of the
    deletion: once ``invalidate_tag`` returns, the copy is gone all the same. (The
    simulator found it: a copy served right after the return.) This process's tracker is
    held up while it reads the deletion's message, as a busy process's may be."""
    layer = make_layer(near_cache=True, near_lease=5)  # the lease outlives the hold-up
    versions = {1: 1}
    load = versioned(layer, versions, tags=["all"])
    tracked(layer)
    copied(layer, load, 1)
    reading, go_on = held_up(layer)
    versions[1] = 2
    members = TagKeys.of(layer.namespace, "all").members
    assert redis_client.zscore(members, load.key(1)) is not None
    with redis_client.pipeline() as earlier:  # what the earlier invalidation did before it failed
        earlier.delete(load.key(1)).zrem(members, load.key(1)).execute()
    assert reading.wait(10)
    returned(layer.invalidate_tag, "all", go_on=go_on)
    served = load(1)
    go_on.set()
    assert served["version"] == 2, "a copy served after invalidate_tag returned"


def test_a_value_past_its_ttl_is_not_served_from_the_near_cache(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(near_cache=True, ttl=0.3, jitter=0)
    versions = {1: 1}
    load = versioned(layer, versions)
    tracked(layer)
    copied(layer, load, 1)
    versions[1] = 2  # the database changed; nobody invalidated: the ttl alone must end the copy
    time.sleep(0.35)
    assert load(1)["version"] == 2


def test_near_ttl_caps_a_copy(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(near_cache=True, near_ttl=0.1)
    load = versioned(layer, {1: 1})
    tracked(layer)
    copied(layer, load, 1)
    fills = layer.stats()["near_fills"]
    time.sleep(0.15)
    load(1)
    assert layer.stats()["near_fills"] == fills + 1  # read from Redis again, and copied again


def test_with_early_refresh_a_copy_ends_before_xfetch_would_likely_refresh(make_layer: Callable[..., Stampede]) -> None:
    """Near hits never refresh early; the reads of Redis do, so with ``early_refresh`` a
    copy ends four of XFetch's deltas (load duration x beta) before the value's ttl."""
    layer = make_layer(near_cache=True, ttl=3.0, jitter=0, early_refresh=1.0)

    @layer.cached_loader("slow:{key}")
    def load(key: int) -> dict[str, int]:
        time.sleep(0.1)
        return {"key": key}

    tracked(layer)
    load(1)
    written = time.monotonic()
    copied(layer, load, 1)
    assert layer._near is not None
    copy = layer._near._copies[load.key(1)]
    assert copy.fresh_until <= written + 3.0 - 4 * 0.1 + 0.01
    assert copy.fresh_until > time.monotonic() + 1.0


def test_evicted_values_drop_copies(own_server: RedisServer) -> None:
    client = redis.Redis.from_url(own_server.url, socket_timeout=5)
    client.config_set("maxmemory", 4 * 1024 * 1024)
    client.config_set("maxmemory-policy", "allkeys-random")
    with Stampede.from_url(own_server.url, near_cache=True) as layer:
        load = versioned(layer, {1: 1})
        tracked(layer)
        copied(layer, load, 1)
        key = load.key(1)
        pipeline = client.pipeline(transaction=False)
        # Random eviction, so when the entry goes is chance: about 2,300 fillers fit, and in
        # 40 trials it went after 23 to 88 batches (200 was once too few). The bound only
        # stops a server that never evicts.
        for batch in range(2000):
            for index in range(100):
                pipeline.set(f"filler:{batch}:{index}", b"x" * 1024)
            pipeline.execute()
            if not client.exists(key):
                break
        assert not client.exists(key), "the server never evicted the entry"
        until(lambda: not held(layer, key), timeout=2)
    client.close()


def test_memory_stays_within_its_bounds() -> None:
    stats = Events("test", RateLimitedLog(logging.getLogger("test")))
    near = NearCache(max_entries=1000, max_bytes=300_000, events=stats, start=lambda: None)
    codec = Codec()
    spec = LoaderSpec(lambda: None, Settings(near_cache=True), codec)
    envelope = codec.encode({"payload": "x" * 100}, time.time(), 0.01, key="k")
    near.renew(time.monotonic() + 60)
    for index in range(100_000):
        ticket = near.begin(f"ns:{{k{index}}}")
        near.fill(ticket, envelope, 60.0, spec)
        if index % 997 == 0:
            copies, size = near.size()
            assert copies <= 1000 and size <= 300_000
    copies, size = near.size()
    assert 0 < copies <= 1000 and size <= 300_000
    assert near.get("ns:{k99999}", codec, False) == {"payload": "x" * 100}  # the newest stays
    assert near.get("ns:{k0}", codec, False) is MISSING  # the oldest went first
    assert not near._reading  # no ticket left behind


def test_memory_bound_through_a_layer(make_layer: Callable[..., Stampede]) -> None:
    layer = make_layer(near_cache=True, near_cache_entries=100)
    load = layer.cached_loader("many:{key}")(lambda key: {"key": key})
    tracked(layer)
    for key in range(300):
        load(key)
        load(key)
        load(key)
    assert layer.stats()["near_fills"] > 100
    assert layer._near is not None and layer._near.size()[0] <= 100
    assert load(299) == {"key": 299}


def test_the_fill_race_stores_no_stale_copy(
    redis_url: str, redis_client: redis.Redis, proxy: FaultProxy, make_layer: Callable[..., Stampede]
) -> None:
    """B's read of v1 is held back by the network while A invalidates and writes v2; the
    invalidation reaches B's tracker first (its connection is direct), and B's late reply
    must not be copied."""
    versions = {1: 1}
    reader = make_layer(proxy.url, near_cache=True, socket_timeout=5)
    assert reader._backend.tracker is not None
    reader._backend.tracker._client = redis.Redis.from_url(redis_url, socket_timeout=5)  # track around the proxy
    writer = make_layer()
    load_b, load_a = versioned(reader, versions), versioned(writer, versions)
    tracked(reader)
    assert reader._runner is not None
    reader._runner.store.get("warm-up")  # a connection, before replies are held back
    key = load_a.key(1)
    load_a(1)  # v1 written
    results: list[dict[str, int]] = []
    with CommandMonitor(redis_url) as monitor:
        proxy.stall_replies()
        thread = threading.Thread(target=lambda: results.append(load_b(1)))
        thread.start()
        until(lambda: any(command[0] == "GET" and key in command for command in monitor.checkpoint_peek()))
    versions[1] = 2
    load_a.invalidate(1)  # completes: B's tracker dropped the key (there was no copy) and spoiled the read
    assert load_a(1) == {"key": 1, "version": 2}
    proxy.flow()
    thread.join(10)
    assert results == [{"key": 1, "version": 1}]  # B's call began before the invalidation: allowed
    assert not held(reader, key)  # ... but its reply was not copied
    assert load_b(1)["version"] == 2
    assert load_b(1)["version"] == 2


@pytest.mark.timing
def test_a_process_cut_off_stops_serving_copies_within_its_lease(
    redis_url: str, proxy: FaultProxy, make_layer: Callable[..., Stampede]
) -> None:
    versions = {1: 1}
    reader = make_layer(proxy.url, near_cache=True, socket_timeout=0.3, socket_connect_timeout=0.3)
    writer = make_layer()
    load_b, load_a = versioned(reader, versions), versioned(writer, versions)
    tracked(reader)
    copied(reader, load_b, 1)
    proxy.stall()  # a black hole: no FIN, the server still thinks the reader is subscribed
    stalled = time.monotonic()
    versions[1] = 2
    started = time.monotonic()
    load_a.invalidate(1)
    waited = time.monotonic() - started
    assert waited < 0.2  # the reader's deadline, not longer
    near = reader._near
    assert near is not None
    # No renewal got through the black hole: the lease ends within NEAR_LEASE of it.
    assert near.lease_until <= stalled + NEAR_LEASE
    until(lambda: near.lease_until <= time.monotonic(), timeout=1)
    assert load_b(1)["version"] == 2  # not the copy: Redis is stalled, so the loader (fail open)
    proxy.flow()


def test_four_processes_never_serve_a_value_older_than_a_completed_invalidation(
    redis_url: str, redis_client: redis.Redis, make_layer: Callable[..., Stampede]
) -> None:
    workers = Workers()
    rng = random.Random(3)
    writer = make_layer(namespace="nearproc")
    invalidate = writer.cached_loader("item:{key}")(lambda key: None).invalidate
    try:
        processes = [
            workers.start(redis_url, "--db-url", redis_url, "--seed", str(index), script=NEAR_WORKER)
            for index in range(4)
        ]
        for process in processes:
            workers.expect(process, "ready")
        stale, near_answers, paused_rounds = [], 0, 0
        for round_number in range(200):
            time.sleep(rng.uniform(0, 0.004))
            paused = rng.choice(processes) if rng.random() < 0.1 else None
            if paused is not None:
                paused.send_signal(signal.SIGSTOP)
                time.sleep(NEAR_LEASE + 0.01)  # past its lease
                paused_rounds += 1
            version = int(redis_client.incr("db:1"))
            invalidate(1)
            if paused is not None:
                paused.send_signal(signal.SIGCONT)
            for process in processes:
                answer = _ask(process)
                near_answers += answer["near"]
                if answer["version"] < version:
                    stale.append((round_number, answer, version))
            for process in processes:  # and once more: from the copy this time, mostly
                near_answers += _ask(process)["near"]
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("quit\n")
            process.stdin.flush()
        stats = [workers.result(process) for process in processes]
    finally:
        workers.stop_all()
    assert stale == [], stale[:5]
    assert paused_rounds > 5
    assert near_answers > 200, near_answers  # the copies were really served
    assert sum(s["near_invalidations"] for s in stats) > 400  # and really dropped


def _ask(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("call\n")
    process.stdin.flush()
    return json.loads(process.stdout.readline())  # type: ignore[no-any-return]


@pytest.mark.timing
def test_invalidate_does_not_wait_for_a_closed_layer(make_layer: Callable[..., Stampede]) -> None:
    holder = make_layer(near_cache=True)
    tracked(holder)
    holder.close()
    writer = make_layer()
    load = versioned(writer, {1: 1})
    started = time.monotonic()
    load.invalidate(1)
    assert time.monotonic() - started < 0.04  # less than a lease: nobody to wait for


def test_async_loaders_hit_the_near_cache_and_their_invalidations_wait(make_layer: Callable[..., Stampede]) -> None:
    versions = {1: 1}
    holder = make_layer(near_cache=True)
    writer = make_layer()

    @holder.cached_loader("item:{key}")
    async def load(key: int) -> dict[str, int]:
        return {"key": key, "version": versions[key]}

    @writer.cached_loader("item:{key}")
    async def write(key: int) -> dict[str, int]:
        return {"key": key, "version": versions[key]}

    async def main() -> None:
        await load(1)
        tracked(holder)
        await load(1)
        await load(1)
        hits = holder.stats()["near_hits"]
        assert (await load(1))["version"] == 1
        assert holder.stats()["near_hits"] == hits + 1
        versions[1] = 2
        await write.invalidate(1)
        assert (await load(1))["version"] == 2

    asyncio.run(main())


def test_bad_settings_are_refused(make_layer: Callable[..., Stampede], redis_url: str) -> None:
    with pytest.raises(ConfigError, match="near_cache"):
        make_layer(near_cache="yes")
    with pytest.raises(ConfigError, match="near_ttl"):
        make_layer(near_cache=True, near_ttl=0)
    with pytest.raises(ConfigError, match="near_cache_entries"):
        make_layer(near_cache_entries=0)
    only_async = Stampede(async_client=lambda: redis.asyncio.Redis.from_url(redis_url, socket_timeout=2))
    with pytest.raises(ConfigError, match="blocking client"):
        only_async.cached_loader("x:{key}", near_cache=True)
    only_async.close()


def test_the_embedded_store_takes_the_setting_and_changes_nothing() -> None:
    with Stampede(near_cache=True) as layer:
        load = layer.cached_loader("x:{key}")(lambda key: {"key": key})
        assert load(1) == load(1) == {"key": 1}
        assert layer.stats()["near_hits"] == 0


def test_a_forked_child_serves_none_of_its_parents_copies_and_tracks_on_its_own(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).parent.parent.joinpath("near_fork_worker.py")), redis_url],
        capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    findings = json.loads(done.stdout.strip().splitlines()[-1])
    assert findings == {
        "copy_after_fork": False,
        "own_member": True,
        "after_invalidation": 2,
        "near_invalidations": findings["near_invalidations"],
    }
    assert findings["near_invalidations"] >= 1
