"""The design's comparison of lock services, measured: one table, one run, one machine.

    python loadtest/bench_lock_services.py            # starts every server on 127.0.0.1
    python loadtest/bench_lock_services.py --quick    # fewer rounds, for CI

Services: Redis (``layer.lock``), Redlock over 5 servers, PostgreSQL (the store's lease
rows: ``layer.lock`` on a ``postgresql://`` layer; and a bare ``pg_advisory_lock`` on one
connection, the database's own session lock), and ZooKeeper (kazoo's Lock recipe; loads
through a layer whose leases are ZooKeeper nodes beside Redis).

1. Uncontended acquire + release, one thread: the median of ``--rounds`` cycles (us).
2. Hand-off: a holder releases while a waiter in another thread (its own connection, as
   another process would have) is blocked on the lock; release to the waiter holding it,
   the median of ``--handoffs`` (ms).
3. Cold-key stampede: two layers (two processes, as far as in-process flights go) of 16
   threads each call one cold key whose loader takes 50 ms; the slowest caller minus the
   loader (ms, the median of ``--stampedes`` rounds) and the loads (must be 1 each round).
4. Cold storm: one layer, 400 threads on 200 distinct cold keys (two threads a key, a
   10 ms loader), all released at once; the slowest caller (ms, the median of
   ``--storms`` rounds) and the keys loaded more than once (0 each round, or the lease
   service fell behind its request timeout and some keys loaded without the cache).
5. Takeover: a holder process is SIGKILLed mid-load while a caller in this process waits
   for its value; the time from the kill to the waiter's call returning (s, the median of
   ``--takeovers``), with the lease each service frees it by: a 1 s ``lock_ttl`` on Redis
   and PostgreSQL, a 2 s session timeout on ZooKeeper (whose holder's Redis key has 30 s).

Prints the table, then one JSON line with every figure. Servers the machine lacks (no
PostgreSQL binaries, no ZooKeeper jars) leave their rows out, saying so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stampede import Redlock, Stampede
from stampede.testing import PostgresServer, RedisServer, ZooKeeperServer, find_postgres, find_zookeeper

LOADER_S = 0.05

HOLDER = """
import sys, time
from stampede import Stampede
url, hosts, ttl, session, key = sys.argv[1:6]
zookeeper = None
if hosts:
    from kazoo.client import KazooClient
    zookeeper = KazooClient(hosts=hosts, timeout=float(session))
    zookeeper.start(timeout=10)
layer = Stampede.from_url(url, namespace="takeover", lock_ttl=float(ttl), zookeeper=zookeeper)

@layer.cached_loader("held:{key}")
def load(key):
    print("loading", flush=True)
    time.sleep(3600)

load(key)
"""


def takeover(url: str, hosts: str, ttl: float, session: float, rounds: int) -> float:
    """The median seconds from SIGKILLing a holder mid-load to a waiter's call returning."""
    times = []
    waiter_layer = Stampede.from_url(url, namespace="takeover", lock_ttl=ttl, wait_timeout=60, zookeeper=hosts or None)
    try:
        for _ in range(rounds):
            key = uuid.uuid4().hex
            holder = subprocess.Popen(
                [sys.executable, "-c", HOLDER, url, hosts, str(ttl), str(session), key],
                stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent,
            )  # fmt: skip
            try:
                assert holder.stdout is not None and holder.stdout.readline().strip() == "loading"
                waits = waiter_layer.stats()["lock_waits"]
                load = waiter_layer.cached_loader("held:{key}")(lambda key: {"key": key})
                done: list[float] = []
                waiter = threading.Thread(target=lambda: load(key) and done.append(time.perf_counter()))  # noqa: B023
                waiter.start()
                while waiter_layer.stats()["lock_waits"] == waits:  # the waiter is waiting on the holder
                    time.sleep(0.005)
                holder.kill()
                killed_at = time.perf_counter()
                waiter.join(60)
                times.append(done[0] - killed_at)
            finally:
                if holder.poll() is None:
                    holder.kill()
                holder.wait(10)
                if holder.stdout is not None:
                    holder.stdout.close()
    finally:
        waiter_layer.close()
    return statistics.median(times)


def uncontended(acquire: Callable[[], Any], release: Callable[[], Any], rounds: int) -> float:
    """The median microseconds of one acquire + release."""
    for _ in range(10):
        acquire(), release()
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        acquire()
        release()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def handoff(make: Callable[[], tuple[Callable[[], Any], Callable[[], Any]]], rounds: int) -> float:
    """The median milliseconds from a release to the blocked waiter holding the lock."""
    holder, waiter = make(), make()
    return statistics.median(one_handoff(holder, waiter) for _ in range(rounds)) * 1000


def one_handoff(
    holder: tuple[Callable[[], Any], Callable[[], Any]], waiter: tuple[Callable[[], Any], Callable[[], Any]]
) -> float:
    holder[0]()
    waiting = threading.Event()
    held_at: list[float] = []

    def wait() -> None:
        waiting.set()
        waiter[0]()
        held_at.append(time.perf_counter())
        waiter[1]()

    thread = threading.Thread(target=wait)
    thread.start()
    waiting.wait()
    time.sleep(0.05)  # the waiter is blocked by now
    released_at = time.perf_counter()
    holder[1]()
    thread.join(30)
    return held_at[0] - released_at


def stampede(make_layer: Callable[[], Stampede], rounds: int) -> tuple[float, list[int]]:
    """The median over rounds of the slowest caller minus the loader (ms), and each round's loads."""
    layers = [make_layer(), make_layer()]
    try:
        rounds_seen = [one_stampede(layers) for _ in range(rounds)]
    finally:
        for layer in layers:
            layer.close()
    return statistics.median(overhead for overhead, _ in rounds_seen), [loads for _, loads in rounds_seen]


def one_stampede(layers: list[Stampede]) -> tuple[float, int]:
    calls: list[int] = []
    key = uuid.uuid4().hex

    def load(name: str) -> dict[str, str]:
        calls.append(1)
        time.sleep(LOADER_S)
        return {"name": name}

    loaders = [layer.cached_loader("bench:{name}")(load) for layer in layers]
    barrier = threading.Barrier(32)
    finished: list[float] = []

    def call(index: int) -> None:
        barrier.wait()
        start = time.perf_counter()
        loaders[index % 2](key)
        finished.append(time.perf_counter() - start)

    threads = [threading.Thread(target=call, args=(index,)) for index in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return (max(finished) - LOADER_S) * 1000, len(calls)


STORM_KEYS = 200
STORM_LOADER_S = 0.01


def cold_storm(make_layer: Callable[[], Stampede], rounds: int) -> tuple[float, list[int]]:
    """The median over rounds of the slowest caller (ms), and each round's keys loaded twice."""
    layer = make_layer()
    try:
        rounds_seen = [one_storm(layer) for _ in range(rounds)]
    finally:
        layer.close()
    return statistics.median(slowest for slowest, _ in rounds_seen), [twice for _, twice in rounds_seen]


def one_storm(layer: Stampede) -> tuple[float, int]:
    calls: list[str] = []  # appended from many threads: an append is atomic, a += on a count is not
    prefix = uuid.uuid4().hex

    def load(name: str) -> dict[str, str]:
        calls.append(name)
        time.sleep(STORM_LOADER_S)
        return {"name": name}

    loader = layer.cached_loader("storm:{name}")(load)
    names = [f"{prefix}-{index % STORM_KEYS}" for index in range(2 * STORM_KEYS)]
    barrier = threading.Barrier(len(names))
    finished: list[float] = []

    def call(name: str) -> None:
        barrier.wait()
        start = time.perf_counter()
        loader(name)
        finished.append(time.perf_counter() - start)

    threads = [threading.Thread(target=call, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return max(finished) * 1000, sum(1 for count in Counter(calls).values() if count > 1)


def layer_lock(layer: Stampede, name: str) -> tuple[Callable[[], Any], Callable[[], Any]]:
    lock = layer.lock(name)
    return (lambda: lock.acquire(timeout=30)), lock.release


@contextmanager
def servers(quick: bool) -> Iterator[dict[str, Any]]:
    with ExitStack() as stack:
        found: dict[str, Any] = {"redis": [stack.enter_context(RedisServer()) for _ in range(5)]}
        if find_postgres() is not None:
            found["postgres"] = stack.enter_context(PostgresServer())
        else:
            print("left out: PostgreSQL (no binaries: pip install pgserver)")
        if not isinstance(find_zookeeper(), str):
            found["zookeeper"] = stack.enter_context(ZooKeeperServer())
        else:
            print(f"left out: ZooKeeper ({find_zookeeper()})")
        yield found


def measure_takeovers(found: dict[str, Any], rounds: int) -> dict[str, float]:
    redis_url = found["redis"][0].url
    taken = {"Redis (lease 1 s)": takeover(redis_url, "", 1.0, 0, rounds)}
    if "postgres" in found:
        taken["PostgreSQL (lease 1 s)"] = takeover(found["postgres"].url, "", 1.0, 0, rounds)
    if "zookeeper" in found:
        hosts = found["zookeeper"].hosts
        taken["ZooKeeper (session 2 s, Redis lease 30 s)"] = takeover(redis_url, hosts, 30.0, 2.0, rounds)
    return taken


def measure(
    found: dict[str, Any], rounds: int, handoffs: int, stampedes: int, storms: int
) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    redis_url = found["redis"][0].url
    urls = [server.url for server in found["redis"]]

    def row(name: str, make_pair: Callable[[], tuple[Callable[[], Any], Callable[[], Any]]],
            make_layer: Callable[[], Stampede] | None) -> None:  # fmt: skip
        acquire, release = make_pair()
        figures: dict[str, Any] = {"acquire_release_us": uncontended(acquire, release, rounds)}
        figures["handoff_ms"] = handoff(make_pair, handoffs)
        if make_layer is not None:
            figures["stampede_ms"], figures["loads"] = stampede(make_layer, stampedes)
            figures["storm_ms"], figures["loaded_twice"] = cold_storm(make_layer, storms)
        table[name] = figures
        print(f"  measured {name}", flush=True)

    with ExitStack() as stack:
        base = stack.enter_context(Stampede.from_url(redis_url, namespace="bench"))
        row("Redis", lambda: layer_lock(base, "lock"), lambda: Stampede.from_url(redis_url, namespace="bench"))

        manager = Redlock(urls)
        stack.callback(manager.close)

        def redlock_pair() -> tuple[Callable[[], Any], Callable[[], Any]]:
            lock = manager.lock("lock", ttl=10)
            return (lambda: lock.acquire(timeout=30)), lock.release

        row("Redlock (5)", redlock_pair,
            lambda: Stampede.from_url(redis_url, namespace="bench", redlock=Redlock(urls)))  # fmt: skip

        if "postgres" in found:
            pg_url = found["postgres"].url
            pg_layer = stack.enter_context(Stampede.from_url(pg_url, namespace="bench"))
            row("PostgreSQL lease rows", lambda: layer_lock(pg_layer, "lock"),
                lambda: Stampede.from_url(pg_url, namespace="bench"))  # fmt: skip
            row("PostgreSQL advisory lock", lambda: advisory_pair(pg_url, stack), None)

        if "zookeeper" in found:
            hosts = found["zookeeper"].hosts
            row("ZooKeeper", lambda: kazoo_pair(hosts, stack),
                lambda: Stampede.from_url(redis_url, namespace="bench", zookeeper=hosts))  # fmt: skip
    return table


def advisory_pair(url: str, stack: ExitStack) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """``pg_advisory_lock`` on a connection of its own: a session lock, released when the
    session ends; it waits in the server, with no lease and no fencing token."""
    import psycopg

    connection = psycopg.connect(url, autocommit=True)
    stack.callback(connection.close)
    return (lambda: connection.execute("SELECT pg_advisory_lock(42)")), (
        lambda: connection.execute("SELECT pg_advisory_unlock(42)")
    )


def kazoo_pair(hosts: str, stack: ExitStack) -> tuple[Callable[[], Any], Callable[[], Any]]:
    from kazoo.client import KazooClient

    client = KazooClient(hosts=hosts)
    client.start(timeout=10)
    stack.callback(client.close)
    stack.callback(client.stop)
    lock = client.Lock("/bench/lock")
    return (lambda: lock.acquire(timeout=30)), lock.release


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--handoffs", type=int, default=20)
    parser.add_argument("--stampedes", type=int, default=5)
    parser.add_argument("--storms", type=int, default=3)
    parser.add_argument("--takeovers", type=int, default=3)
    options = parser.parse_args()
    if options.quick:
        options.rounds, options.handoffs, options.stampedes, options.storms, options.takeovers = 50, 3, 1, 1, 1
    with servers(options.quick) as found:
        table = measure(found, options.rounds, options.handoffs, options.stampedes, options.storms)
        taken = measure_takeovers(found, options.takeovers)
    print()
    print(f"{'service':<26} {'acquire+release':>16} {'hand-off':>10} {'stampede':>10}  loads  "
          f"{'cold storm':>10}  loaded twice")  # fmt: skip
    for name, figures in table.items():
        stamp = f"{figures['stampede_ms']:>8.1f}ms" if "stampede_ms" in figures else f"{'-':>10}"
        loads = ",".join(str(n) for n in figures.get("loads", [])) or "-"
        storm = f"{figures['storm_ms']:>8.0f}ms" if "storm_ms" in figures else f"{'-':>10}"
        twice = ",".join(str(n) for n in figures.get("loaded_twice", [])) or "-"
        print(f"{name:<26} {figures['acquire_release_us']:>14.0f}us {figures['handoff_ms']:>8.2f}ms {stamp}  "
              f"{loads}  {storm}  {twice}")  # fmt: skip
    print()
    print("holder SIGKILLed mid-load: kill to the waiter's value")
    for name, seconds in taken.items():
        print(f"  {name:<44} {seconds:6.2f} s")
    print(json.dumps({**table, "takeover_s": taken}))


if __name__ == "__main__":
    main()
