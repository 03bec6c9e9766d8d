"""A worker process for the Redlock test: threads adding 1 to a counter under a Redlock.

The counter is on another server (--counter-url), read and written in two commands with a
pause between, so two holders at once would lose an update. Prints "ready", waits for
"go", then prints one JSON line: how many increments it made and how many tries failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import redis

from stampede import Redlock


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", action="append", required=True, help="a Redlock server (repeat)")
    parser.add_argument("--counter-url", required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    options = parser.parse_args()
    counter = redis.Redis.from_url(options.counter_url, socket_timeout=5)
    manager = Redlock(options.url, namespace="redlock-test")
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    done = {"increments": 0, "failed": 0}
    guard = threading.Lock()

    def work() -> None:
        for _ in range(options.rounds):
            lock = manager.lock("counter", ttl=5, timeout=30, retry_delay=0.02)
            if not lock.acquire():
                with guard:
                    done["failed"] += 1
                continue
            value = int(counter.get("redlock:counter") or 0)
            time.sleep(0.001)  # the window a second holder would use
            counter.set("redlock:counter", value + 1)
            lock.release()
            with guard:
                done["increments"] += 1

    threads = [threading.Thread(target=work) for _ in range(options.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    manager.close()
    print(json.dumps(done), flush=True)


if __name__ == "__main__":
    main()
