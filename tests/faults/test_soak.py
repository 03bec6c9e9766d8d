"""A bounded soak: many keys, random loader latencies, random faults, for a while.

Three layers (three processes' worth of flight tables, subscribers and watchdogs) reach
Redis through a FaultProxy, 8 threads each, over 40 keys. A chaos thread meanwhile cuts
every connection, adds latency beyond the socket timeout, stalls the network, and
invalidates keys after bumping their version in the "database". It stops by itself.

Three more layers, each behind a FaultProxy of its own, meanwhile take a named lock
("mutex", a 0.3 s lease) over and over, and write to a resource that checks fencing
tokens; a second chaos thread disturbs their networks. A holder whose network stalls
past its lease loses it, and another holder may get in.

Asserted at the end: no call hung (each within its bound), no caller got another key's
value, no caller got a version older than one a completed invalidation (by any layer) had
already published when the call began, no wait ran out, and no lock is left behind. For
the named lock: every overlap of two holders, and every write the resource refused for a
stale fence, happens to a holder that is told at release that its lease was lost (or
that Redis could not be reached to say).

    STAMPEDE_SOAK_SECONDS=300 python -m pytest tests/faults/test_soak.py -s   # the long form

CI runs the short form (8 s). ``-s`` prints the figures.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import pytest
import redis

from stampede import BackendUnavailable, LockLost, Stampede
from stampede.testing import FaultProxy

from ..scenarios import NETWORK_FAULTS, disturb

SECONDS = float(os.environ.get("STAMPEDE_SOAK_SECONDS", "8"))
KEYS = 40
SOCKET_TIMEOUT = 0.2
CALL_BOUND = 5.0  # seconds: wait_timeout is 10, so a call this slow means a lost wake-up


@pytest.mark.parametrize("near", [False, True], ids=["", "near-cache"])
def test_soak_with_random_faults(
    redis_url: str, redis_client: redis.Redis, figures: Callable[..., None], near: bool
) -> None:
    """With ``near``, the three cache layers serve from near caches whose streams go
    through the same disturbed network."""
    port = redis_client.connection_pool.connection_kwargs["port"]
    versions = [0] * KEYS  # the database: a version per key, bumped before an invalidation
    versions_lock = threading.Lock()
    loads = [0] * KEYS
    stop = threading.Event()
    problems: list[str] = []
    counts = {"calls": 0, "faults": 0, "invalidations": 0, "backend_errors": 0, "slowest": 0.0}
    counts_lock = threading.Lock()

    def query(key: int) -> dict[str, int]:
        with versions_lock:
            loads[key] += 1
            version = versions[key]
        time.sleep(random.uniform(0, 0.03))
        return {"key": key, "version": version}

    with ExitStack() as stack:
        proxy = stack.enter_context(FaultProxy(port))
        lock_proxies = [stack.enter_context(FaultProxy(port)) for _ in range(3)]
        layers = [
            Stampede.from_url(
                proxy.url,
                namespace="soak",
                ttl=1.0,
                lock_ttl=0.6,
                wait_timeout=10,
                socket_timeout=SOCKET_TIMEOUT,
                socket_connect_timeout=SOCKET_TIMEOUT,
                breaker_threshold=5,
                breaker_cooldown=0.3,
                near_cache=near,
            )
            for _ in range(3)
        ]
        loaders = [layer.cached_loader("item:{key}")(query) for layer in layers]
        floors = [0] * KEYS  # per key: the version the completed invalidations published

        def caller(index: int) -> None:
            layer = index % len(layers)
            rng = random.Random(index)
            while not stop.is_set():
                key = rng.randrange(KEYS)
                floor = floors[key]
                started = time.monotonic()
                try:
                    value = loaders[layer](key)
                except BackendUnavailable:
                    continue  # not with on_backend_error="load"; recorded as a problem below
                elapsed = time.monotonic() - started
                with counts_lock:
                    counts["calls"] += 1
                    counts["slowest"] = max(counts["slowest"], elapsed)
                    if value.get("key") != key:
                        problems.append(f"key {key} got {value}")
                    elif value["version"] < floor:
                        problems.append(f"key {key} got version {value['version']} after invalidating {floor}")
                    if elapsed > CALL_BOUND:
                        problems.append(f"a call of key {key} took {elapsed:.1f} s")

        def chaos() -> None:
            rng = random.Random(7)
            while not stop.wait(rng.uniform(0.05, 0.4)):
                fault = rng.choice([*NETWORK_FAULTS, "invalidate", "invalidate"])
                if fault in NETWORK_FAULTS:
                    disturb(proxy, fault, SOCKET_TIMEOUT * 1.5, rng, stop)
                else:
                    layer, key = rng.randrange(len(layers)), rng.randrange(KEYS)
                    with versions_lock:
                        versions[key] += 1
                        version = versions[key]
                    try:
                        loaders[layer].invalidate(key)
                    except BackendUnavailable:
                        with counts_lock:
                            counts["backend_errors"] += 1
                        continue  # not completed: it promises nothing
                    floors[key] = max(floors[key], version)
                    with counts_lock:
                        counts["invalidations"] += 1
                    continue
                with counts_lock:
                    counts["faults"] += 1

        resource = {"fence": 0}  # the highest fence the resource has taken a write with
        inside: set[int] = set()  # the holders inside their critical section now
        told_to_expect: set[int] = set()  # holders overlapped by a later one, or refused a write
        holders = itertools.count()  # a number for each acquisition
        resource_lock = threading.Lock()
        mutex = {"held": 0, "overlaps": 0, "fenced_out": 0, "lost": 0, "unknown": 0, "timeouts": 0, "faults": 0}

        def note(outcome: str) -> None:
            with resource_lock:
                mutex[outcome] += 1

        def write(holder: int, fence: int | None) -> None:
            """The protected resource: it takes a write whose fence is no smaller than any
            it has taken, and refuses the others."""
            with resource_lock:
                if fence is not None and fence >= resource["fence"]:
                    resource["fence"] = fence
                else:
                    mutex["fenced_out"] += 1
                    told_to_expect.add(holder)

        def locker(layer: Stampede) -> None:
            rng = random.Random(id(layer))
            while not stop.is_set():
                lock = layer.lock("mutex", ttl=0.3, timeout=2)  # shorter than the longest stalls
                try:
                    if not lock.acquire():
                        note("timeouts")
                        continue
                except BackendUnavailable:
                    continue
                holder = next(holders)
                with resource_lock:
                    mutex["held"] += 1
                    mutex["overlaps"] += bool(inside)
                    told_to_expect.update(inside)  # they were inside when their lease was taken
                    inside.add(holder)
                write(holder, lock.fence)
                # Mostly short; one hold in five outlasts the lease, kept by renewals unless
                # the holder's network stalls.
                time.sleep(rng.uniform(0, 0.1) if rng.random() < 0.8 else rng.uniform(0.3, 0.6))
                write(holder, lock.fence)  # the late write a paused ex-holder would make
                with resource_lock:
                    inside.discard(holder)
                try:
                    lock.release()
                except LockLost:
                    note("lost")
                    continue
                except BackendUnavailable:
                    note("unknown")
                    continue
                with resource_lock:
                    if holder in told_to_expect:
                        problems.append("a holder overlapped by another, or fenced out, released without LockLost")

        threads = [threading.Thread(target=caller, args=(index,)) for index in range(24)]
        lock_layers = [
            Stampede.from_url(
                lock_proxy.url,
                namespace="soak",
                socket_timeout=SOCKET_TIMEOUT,
                socket_connect_timeout=SOCKET_TIMEOUT,
                breaker_cooldown=0.3,
            )
            for lock_proxy in lock_proxies
        ]
        threads += [threading.Thread(target=locker, args=(layer,)) for layer in lock_layers]
        threads.append(threading.Thread(target=chaos))

        def lock_chaos() -> None:
            rng = random.Random(11)
            while not stop.wait(rng.uniform(0.05, 0.4)):
                disturb(rng.choice(lock_proxies), rng.choice(NETWORK_FAULTS), SOCKET_TIMEOUT * 1.5, rng, stop)
                note("faults")

        threads.append(threading.Thread(target=lock_chaos))
        for thread in threads:
            thread.start()
        time.sleep(SECONDS)  # the soak's length: the threads run meanwhile
        stop.set()
        for each in (proxy, *lock_proxies):
            each.flow()
            each.delay = 0.0
        for thread in threads:
            thread.join(CALL_BOUND + 5)
        hung = [thread.name for thread in threads if thread.is_alive()]
        stats = [layer.stats() for layer in layers]
        for layer in layers + lock_layers:
            layer.close()

    counts["loads"] = sum(loads)
    counts["wait_timeouts"] = sum(s["wait_timeouts"] for s in stats)
    counts["stale_writes_prevented"] = sum(s["stale_writes_prevented"] for s in stats)
    counts["near_hits"] = sum(s["near_hits"] for s in stats)
    # A call that finds the server failing (a fault, or a machine too busy to answer within
    # the socket timeout) loads without the cache, as documented: at most one load each.
    counts["uncached"] = sum(s["redis_errors"] for s in stats)
    print(f"\nsoak {SECONDS:g} s: {counts}; named lock: {mutex}")
    figures(
        f"soak: 3 layers x 8 threads, {KEYS} keys, cuts/latency/stalls, invalidations, {SECONDS:g} s"
        f"{', near cache' if near else ''}",
        worst=counts["slowest"],
        deadline=CALL_BOUND,
        loads=counts["loads"],
        bound=f"< calls/2 ({counts['calls']} calls; {counts['uncached']} loaded without the cache)",
        exceptions=f"none; stale values {len(problems)} after {counts['invalidations']} invalidations",
    )
    assert hung == [], f"hung: {hung}"
    assert problems == [], problems[:10]
    assert counts["calls"] > 100 and counts["faults"] > 0 and counts["invalidations"] > 0, counts
    assert counts["wait_timeouts"] == 0
    # the cache still collapsed the loads of the calls it could serve
    assert counts["loads"] - counts["uncached"] < (counts["calls"] - counts["uncached"]) / 2, counts
    assert mutex["held"] > 10, mutex
    assert (counts["near_hits"] > 0) == near, counts
    leftover: list[Any] = [key for key in redis_client.scan_iter("soak:*:lock") if redis_client.pttl(key) > 600]
    assert leftover == []  # a lock outliving its lease would mean a renewal that never stopped
