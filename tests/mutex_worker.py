"""A worker process for the mutual-exclusion tests: threads adding 1 to a counter under a
lock, a Redlock over every --url, or with --single a layer.lock on the first --url.

The counter is on another server (--counter-url), read and written in two commands with a
pause between, so two holders at once would lose an update. Prints "ready", waits for
"go", then prints one JSON line: how many increments it made, how many tries failed, and
the fences it held (layer.lock only). A try that fails (its 30 s timeout ran out) is
counted and made again: Redlock is not fair (a contender retries at random moments, and a
busy machine may keep one thread out of 32 for longer), and the increments are the point.
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", action="append", required=True, help="a Redlock server (repeat)")
    parser.add_argument("--counter-url", required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--single", action="store_true", help="layer.lock on the first --url")
    options = parser.parse_args()
    counter = redis.Redis.from_url(options.counter_url, socket_timeout=5)
    manager = Redlock(options.url, namespace="redlock-test")
    layer = Stampede.from_url(options.url[0], namespace="lock-test")

    def make_lock() -> Any:
        if options.single:
            return layer.lock("counter", ttl=5, timeout=30)
        return manager.lock("counter", ttl=5, timeout=30, retry_interval=0.1)

    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    done: dict[str, Any] = {"increments": 0, "failed": 0, "fences": []}
    guard = threading.Lock()

    def work() -> None:
        for _ in range(options.rounds):
            lock = make_lock()
            while not lock.acquire():  # its timeout ran out: told, and tried again
                with guard:
                    done["failed"] += 1
                lock = make_lock()
            value = int(counter.get("redlock:counter") or 0)
            time.sleep(0.001)  # the window a second holder would use
            counter.set("redlock:counter", value + 1)
            fence = getattr(lock, "fence", None)
            with guard:  # still under the lock: the fences go in in the order they were held
                done["increments"] += 1
                if fence is not None:
                    done["fences"].append(fence)
            lock.release()

    threads = [threading.Thread(target=work) for _ in range(options.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    manager.close()
    layer.close()
    print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
