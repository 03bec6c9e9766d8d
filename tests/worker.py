"""A worker process for the multi-process tests: threads calling one cached loader.

Prints "ready" once its layer is connected, waits for "go" on stdin, then every thread
calls the loader for each of its keys; prints one JSON line with what it saw. The loader
counts its calls on the server (INCR; --count-url names another one, which outlives a
killed cache server), so the count spans every process.
With --hang the loader prints "loading" and never returns (the holder to be killed); with
--announce it prints "loading" and goes on. --tag marks the values this worker loads.
--redlock (repeated) holds the loads' leases on those lock servers too.
--ttl and --stale-while-revalidate set those settings; values then carry "v", the
loader's call count, and the output lists the versions seen and how many were stale.
--cluster: --url is a node of a Redis Cluster (count on another server with --count-url).
--zookeeper: the leases are also ZooKeeper nodes (--zk-session: its session timeout). A
postgresql:// --url makes the store PostgreSQL (count on a Redis server with --count-url).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

import redis

from stampede import Redlock, Stampede


def say(line: str) -> None:
    """One line to the test, in one write: ``print`` writes the text and its newline
    apart, so a refresh thread's line could land between them (two lines run together,
    then an empty one)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--count-url", help="where to count loader calls; default: --url")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--keys", type=int, default=1)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--lock-ttl", type=float, default=10.0)
    parser.add_argument("--wait-timeout", type=float, default=30.0)
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--announce", action="store_true")
    parser.add_argument("--tag", default="")
    parser.add_argument("--redlock", action="append", default=[], help="a lock server (repeat): Redlock leases")
    parser.add_argument("--redlock-timeout", type=float, default=0.05, help="the lock servers' socket timeout (s)")
    parser.add_argument("--ttl", type=float, default=300.0)
    parser.add_argument("--stale-while-revalidate", type=float, default=0.0)
    parser.add_argument("--cluster", action="store_true", help="--url is a node of a Redis Cluster")
    parser.add_argument("--zookeeper", help="ZooKeeper hosts: the loads' leases are also ZooKeeper nodes")
    parser.add_argument("--zk-session", type=float, default=10.0, help="the ZooKeeper session timeout (s)")
    options = parser.parse_args()
    versioned = options.stale_while_revalidate > 0

    counter = redis.Redis.from_url(options.count_url or options.url, socket_timeout=5)
    redlock = Redlock(options.redlock, socket_timeout=options.redlock_timeout) if options.redlock else None
    zookeeper = None
    if options.zookeeper:
        from kazoo.client import KazooClient

        zookeeper = KazooClient(hosts=options.zookeeper, timeout=options.zk_session)
        zookeeper.start(timeout=10)
    layer = Stampede.from_url(
        options.url,
        namespace="proc",
        lock_ttl=options.lock_ttl,
        wait_timeout=options.wait_timeout,
        redlock=redlock,
        ttl=options.ttl,
        stale_while_revalidate=options.stale_while_revalidate,
        jitter=0 if versioned else 0.1,
        cluster=options.cluster,
        zookeeper=zookeeper,
    )

    @layer.cached_loader("item:{key}")
    def load(key: int) -> dict[str, Any]:
        calls = counter.incr(f"calls:{key}")
        if options.hang or options.announce:
            say("loading")
        if options.hang:
            time.sleep(3600)
        time.sleep(options.delay)
        if versioned:
            return {"key": key, "v": calls}
        return {"key": key, "by": options.tag} if options.tag else {"key": key}

    layer._runner.store.get("warm-up")  # type: ignore[attr-defined]  # open a connection
    say("ready")
    if sys.stdin.readline().strip() != "go":
        return
    latencies: list[float] = []
    wrong: list[object] = []
    versions: set[int] = set()
    stale: list[bool] = []
    lock = threading.Lock()

    def run(index: int) -> None:
        for step in range(options.keys):
            key = (index * 13 + step) % options.keys
            start = time.perf_counter()
            fetched = load.fetch(key)
            elapsed = time.perf_counter() - start
            value = fetched.value
            with lock:
                latencies.append(elapsed)
                stale.append(fetched.stale)
                if value.get("key") != key:
                    wrong.append(value)
                if versioned:
                    versions.add(value["v"])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(options.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    say(json.dumps({"calls": len(latencies), "wrong": wrong, "max_latency": max(latencies),
                    "versions": sorted(versions), "stale": sum(stale), "stats": layer.stats()}))  # fmt: skip
    if options.hang and versioned:  # hold the hanging refresh until killed
        time.sleep(3600)
    deadline = time.monotonic() + 10  # close() does not wait for a background refresh
    while layer._runner.refresher.running() and time.monotonic() < deadline:  # type: ignore[union-attr]
        time.sleep(0.01)
    layer.close()
    if zookeeper is not None:
        zookeeper.stop()
        zookeeper.close()


if __name__ == "__main__":
    main()
