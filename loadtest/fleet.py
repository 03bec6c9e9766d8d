"""What the fleet benchmarks (``bench_fleet.py``, ``bench_warm.py``) share: a loader that
counts, in the server, the loads running at once and each key's loads; and a fleet of
worker processes started together.

A worker prints ``ready`` once its connections are open, waits for ``go`` on its stdin,
and prints its result as JSON on its last line. Counts live under ``<namespace>:count:``,
so that every process of a run adds to the same ones.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import redis

COUNT_LOAD = """
local running = redis.call('INCR', KEYS[1])
if running > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], running) end
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
return running
"""
"""A load begins: one more running (and the peak kept exact, at each load's start), and
one more load of its key."""


def count_keys(namespace: str) -> tuple[str, str, str]:
    """The keys of a run's counts: loads running now, the most at once, loads per key."""
    return f"{namespace}:count:running", f"{namespace}:count:peak", f"{namespace}:count:loads"


def counted_query(url: str, namespace: str, delay: float) -> Callable[[int], dict[str, int]]:
    """A loader of ``{"id": key}`` that takes ``delay`` seconds and counts itself."""
    client = redis.Redis.from_url(url)
    begin = client.register_script(COUNT_LOAD)
    keys = list(count_keys(namespace))

    def query(key: int) -> dict[str, int]:
        begin(keys=keys, args=[key])
        try:
            time.sleep(delay)
            return {"id": key}
        finally:
            client.decr(keys[0])

    return query


def counted(url: str, namespace: str) -> tuple[int, dict[int, int]]:
    """What a run counted: the most loads at once, and each key's loads."""
    client = redis.Redis.from_url(url)
    _, peak, loads = count_keys(namespace)
    per_key = {int(key): int(count) for key, count in client.hgetall(loads).items()}
    return int(client.get(peak) or 0), per_key


def run_processes(
    command: list[str], processes: int, timeout: float, on_ready: Callable[[], None] | None = None
) -> list[dict[str, Any]]:
    """Start ``processes`` workers (``command --seed N``), let them all go at once (after
    ``on_ready``, once every one is ready), and return each one's result. Every process
    is gone on return."""
    started = [subprocess.Popen([*command, "--seed", str(seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True) for seed in range(processes)]  # fmt: skip
    try:
        for process in started:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        if on_ready is not None:
            on_ready()
        for process in started:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        return [json.loads(process.communicate(timeout=timeout)[0].splitlines()[-1]) for process in started]
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait(5)
