"""One process of a fleet sharing a load budget (tests/promises/test_budget.py): threads
over cold keys, each load counted in the server while it runs (the peak kept there), so
the loads running at once are counted across every process.

    python -m tests.budget_worker REDIS_URL NAMESPACE KEYS THREADS BUDGET
"""

from __future__ import annotations

import sys
import threading
import time

import redis

from stampede import Stampede

BEGIN = """
local running = redis.call('INCR', KEYS[1])
if running > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], running) end
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
return running
"""


def main(url: str, namespace: str, keys: int, threads: int, budget: int) -> None:
    client = redis.Redis.from_url(url)
    begin = client.register_script(BEGIN)
    running, peak, loads = f"{namespace}:running", f"{namespace}:peak", f"{namespace}:loads"
    with Stampede.from_url(url, namespace=namespace, max_concurrent_loads=budget) as layer:

        @layer.cached_loader("item:{key}")
        def load(key: int) -> int:
            begin(keys=[running, peak, loads], args=[key])
            try:
                time.sleep(0.02)
                return key
            finally:
                client.decr(running)

        client.incr(f"{namespace}:ready")
        deadline = time.monotonic() + 30
        while int(client.get(f"{namespace}:ready") or 0) < 3:  # the fleet starts together
            assert time.monotonic() < deadline, "the other workers never started"
            time.sleep(0.005)

        failures: list[BaseException] = []

        def caller(offset: int) -> None:
            try:
                for index in range(keys):
                    key = (index + offset) % keys
                    assert load(key) == key
            except BaseException as error:
                failures.append(error)

        workers = [threading.Thread(target=caller, args=(number * 5,)) for number in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if failures:
            raise failures[0]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
