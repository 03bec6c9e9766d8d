"""A worker process that keeps one key in its near cache, for the cross-process near-cache
tests: a background thread calls the loader at random moments (so fills race the
parent's invalidations), and the parent asks for a call on stdin.

Prints "ready" once its near cache holds the key under a live lease. Then, per line:
"call" prints one JSON line {"version": ..., "near": whether it was a near hit};
"quit" prints the layer's stats and exits.
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()

    database = redis.Redis.from_url(options.db_url, socket_timeout=5)
    layer = Stampede.from_url(options.url, namespace="nearproc", near_cache=True, ttl=60)

    @layer.cached_loader("item:{key}")
    def load(key: int) -> dict[str, int]:
        return {"key": key, "version": int(database.get(f"db:{key}") or 0)}

    deadline = time.monotonic() + 10
    while layer.stats()["near_hits"] == 0 and time.monotonic() < deadline:
        load(1)
        time.sleep(0.005)
    print("ready", flush=True)

    stop = threading.Event()

    def background() -> None:
        rng = random.Random(options.seed)
        while not stop.wait(rng.uniform(0, 0.004)):
            load(1)

    thread = threading.Thread(target=background)
    thread.start()
    for line in sys.stdin:
        if line.strip() != "call":
            break
        hits = layer.stats()["near_hits"]
        value = load(1)
        near = layer.stats()["near_hits"] > hits  # the background thread may hit too: a hint only
        print(json.dumps({"version": value["version"], "near": near}), flush=True)
    stop.set()
    thread.join(10)
    print(json.dumps(layer.stats()), flush=True)
    layer.close()


if __name__ == "__main__":
    main()
