"""A layer used, then forked mid-load (as Locust's --processes, gunicorn --preload and
multiprocessing's fork do): a script the fork test runs in a subprocess.

    python tests/fork_worker.py REDIS_URL

The parent loads one key, then forks while one of its threads is loading a second key
("during"). The child calls "during" from 20 threads (a flight its parent's thread
leads, which does not exist in the child) and "child" from 20 more, while the parent
also calls "child". Prints the child's result and the loader calls counted on the
server, as JSON lines.
"""

import json
import os
import sys
import threading
import time

import redis

from stampede import Stampede

url = sys.argv[1]
counter = redis.Redis.from_url(url, socket_timeout=5)
layer = Stampede.from_url(url, namespace="fork", lock_ttl=1, wait_timeout=20)
loading = threading.Event()


@layer.cached_loader("k:{key}")
def load(key: str) -> str:
    counter.incr(f"calls:{key}")
    if key == "during":
        loading.set()
    time.sleep(0.3)
    return key


def burst(key: str, threads: int = 20) -> list[str]:
    values: list[str] = []
    workers = [threading.Thread(target=lambda: values.append(load(key))) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return values


load("warm")  # the parent's pool, watchdog thread and flight table are in use
leader = threading.Thread(target=load, args=("during",))
leader.start()
loading.wait(10)
pid = os.fork()
if pid == 0:
    started = time.monotonic()
    values = burst("during") + burst("child")
    print(json.dumps({"child_values": sorted(set(values)), "child_seconds": time.monotonic() - started,
                      "child_wait_timeouts": layer.stats()["wait_timeouts"]}), flush=True)  # fmt: skip
    os._exit(0)
leader.join()
burst("child")
os.waitpid(pid, 0)
print(json.dumps({key.decode(): int(counter.get(key) or 0) for key in counter.keys("calls:*")}), flush=True)
layer.close()
