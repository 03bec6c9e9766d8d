"""A worker process for the invalidation stress test: threads calling a cached loader
over many keys, through a network its parent cuts, slows and stalls, while the parent
updates the database and invalidates.

The loader reads the key's version from the "database" (``db:<key>`` on --db-url, on a
connection of its own that the faults do not touch). With --groups (tag mode) a key's
version is its group's (``db:group:<key % groups>``), and its entry is tagged
``group:<key % groups>``.

Prints "ready" once connected, waits for "go" on stdin, and calls until stdin says
anything else or closes; then saves its history (``stampede.testing.Recorder``: every
call and load, with the version it read) to --history and prints one JSON line of
counts, with the moments its layer found the server failing (``failures_seen``): a
machine too busy to answer within the 0.2 s socket timeout fails a worker as surely as
its parent's faults do, and a call that finds the server failing loads without the
cache, as documented (docs/failures.md).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time

import redis

from stampede import Stampede
from stampede.testing import Recorder
from stampede.testing.nemesis import FailuresSeen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--keys", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--near", action="store_true", help="with the near cache on")
    parser.add_argument("--groups", type=int, default=0, help="tag mode: keys in this many groups, one tag each")
    parser.add_argument("--history", required=True, help="where to save the recorded history")
    options = parser.parse_args()
    recorder = Recorder(f"worker{options.seed}")

    database = redis.Redis.from_url(options.db_url, socket_timeout=5)
    seen = FailuresSeen()
    layer = Stampede.from_url(
        options.url, namespace="stress", ttl=1.0, lock_ttl=0.6, wait_timeout=10, socket_timeout=0.2,
        socket_connect_timeout=0.2, breaker_threshold=5, breaker_cooldown=0.3, near_cache=options.near,
        observers=[seen],
    )  # fmt: skip
    loads = [0] * options.keys

    if options.groups:  # tag mode: a key's version is its group's, invalidated by tag

        @layer.cached_loader("item:{group}:{key}", tags=["group:{group}"])
        def in_group(group: int, key: int) -> dict[str, int]:
            loads[key] += 1
            with recorder.op("load", key) as op:
                version = int(database.get(f"db:group:{group}") or 0)
                op.saw(version)
                time.sleep(random.uniform(0, 0.02))
            return {"key": key, "version": version}

        def load(key: int) -> dict[str, int]:
            return in_group(key % options.groups, key)

    else:

        @layer.cached_loader("item:{key}")
        def load(key: int) -> dict[str, int]:
            loads[key] += 1
            with recorder.op("load", key) as op:
                version = int(database.get(f"db:{key}") or 0)
                op.saw(version)
                time.sleep(random.uniform(0, 0.02))
            return {"key": key, "version": version}

    layer._runner.store.get("warm-up")  # type: ignore[attr-defined]  # open a connection
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    stop = threading.Event()

    def run(index: int) -> None:
        rng = random.Random(options.seed * 1000 + index)
        while not stop.is_set():
            key = rng.randrange(options.keys)
            with recorder.op("read", key) as op:
                value = load(key)
                op.saw(value["version"], source=value.get("key"))

    threads = [threading.Thread(target=run, args=(index,)) for index in range(options.threads)]
    for thread in threads:
        thread.start()
    sys.stdin.readline()  # "stop", or the parent closed our stdin
    stop.set()
    for thread in threads:
        thread.join(30)
    hung = sum(thread.is_alive() for thread in threads)
    recorder.save(options.history)
    result = {"hung": hung, "loads": sum(loads), "stats": layer.stats(), "failures_seen": seen.moments}
    print(json.dumps(result), flush=True)
    layer.close()


if __name__ == "__main__":
    main()
