"""A worker process for the invalidation stress test: threads calling a cached loader
over many keys, through a network its parent cuts, slows and stalls, while the parent
updates the database and invalidates.

The loader reads the key's version from the "database" (``db:<key>`` on --db-url, on a
connection of its own that the faults do not touch). With --groups (tag mode) a key's
version is its group's (``db:group:<key % groups>``), and its entry is tagged
``group:<key % groups>``. Every call is recorded as
(key, started, version), ``started`` from time.monotonic(): one clock for every process
of the machine, so the parent can tell which calls began after an invalidation completed.

Prints "ready" once connected, waits for "go" on stdin, and calls until stdin says
anything else or closes; then prints one JSON line with what it saw.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from typing import Any

import redis

from stampede import Stampede


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--keys", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--near", action="store_true", help="with the near cache on")
    parser.add_argument("--groups", type=int, default=0, help="tag mode: keys in this many groups, one tag each")
    options = parser.parse_args()

    database = redis.Redis.from_url(options.db_url, socket_timeout=5)
    layer = Stampede.from_url(
        options.url, namespace="stress", ttl=1.0, lock_ttl=0.6, wait_timeout=10, socket_timeout=0.2,
        socket_connect_timeout=0.2, breaker_threshold=5, breaker_cooldown=0.3, near_cache=options.near,
    )  # fmt: skip
    loads = [0] * options.keys

    if options.groups:  # tag mode: a key's version is its group's, invalidated by tag

        @layer.cached_loader("item:{group}:{key}", tags=["group:{group}"])
        def in_group(group: int, key: int) -> dict[str, int]:
            loads[key] += 1
            version = int(database.get(f"db:group:{group}") or 0)
            time.sleep(random.uniform(0, 0.02))
            return {"key": key, "version": version}

        def load(key: int) -> dict[str, int]:
            return in_group(key % options.groups, key)

    else:

        @layer.cached_loader("item:{key}")
        def load(key: int) -> dict[str, int]:
            loads[key] += 1
            version = int(database.get(f"db:{key}") or 0)
            time.sleep(random.uniform(0, 0.02))
            return {"key": key, "version": version}

    layer._runner.store.get("warm-up")  # type: ignore[attr-defined]  # open a connection
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    stop = threading.Event()
    calls: list[tuple[int, float, int]] = []
    wrong: list[Any] = []
    slowest = [0.0]

    def run(index: int) -> None:
        rng = random.Random(options.seed * 1000 + index)
        while not stop.is_set():
            key = rng.randrange(options.keys)
            started = time.monotonic()
            value = load(key)
            slowest[0] = max(slowest[0], time.monotonic() - started)
            if value.get("key") != key:
                wrong.append(value)
            calls.append((key, started, value["version"]))

    threads = [threading.Thread(target=run, args=(index,)) for index in range(options.threads)]
    for thread in threads:
        thread.start()
    sys.stdin.readline()  # "stop", or the parent closed our stdin
    stop.set()
    for thread in threads:
        thread.join(30)
    hung = sum(thread.is_alive() for thread in threads)
    print(json.dumps({"calls": calls, "wrong": wrong, "hung": hung, "loads": sum(loads), "slowest": slowest[0],
                      "stats": layer.stats()}), flush=True)  # fmt: skip
    layer.close()


if __name__ == "__main__":
    main()
