"""What the fleet benchmarks (``bench_fleet.py``, ``bench_warm.py``) share: loaders that
count the loads running at once and each key's loads (in the server, or on a timeline
each process keeps); and a fleet of worker processes started together.

A worker prints ``ready`` once its connections are open, waits for ``go`` on its stdin,
and prints its result as JSON on its last line. Counts live under ``<namespace>:count:``,
so that every process of a run adds to the same ones.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Callable, Iterable
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


class Timeline:
    """Each load of one process: its key, and when it began and ended on the machine's
    monotonic clock (CLOCK_MONOTONIC, one clock for every process of the machine), kept
    in memory. The merged timelines of a fleet give the loads running at every moment,
    exactly (``running``), where a count in the server costs each load two round trips
    (about 1.8 ms of a 10 ms load among 128 threads on 2 cores) and a sampler sees only
    its samples."""

    def __init__(self) -> None:
        self.loads: list[tuple[int, float, float]] = []

    def query(self, delay: float) -> Callable[[int], dict[str, int]]:
        """A loader of ``{"id": key}`` that takes ``delay`` seconds and is recorded."""

        def query(key: int) -> dict[str, int]:
            began = time.monotonic()
            try:
                time.sleep(delay)
                return {"id": key}
            finally:
                self.loads.append((key, began, time.monotonic()))  # one list.append: thread-safe

        return query


@dataclasses.dataclass(frozen=True)
class Running:
    """What the merged timelines of a run say of its loads running at once."""

    peak: int  # the most at any moment
    over: float  # the seconds during which more than the bound ran
    mean: float  # on average over the span from the first load's start to the last one's end
    busy: float  # the loads' own seconds, summed

    @classmethod
    def of(cls, loads: Iterable[tuple[int, float, float]], bound: int) -> Running:
        # a load that ends at the instant another begins does not overlap it: ends first
        edges = sorted(edge for _, began, ended in loads for edge in ((began, 1), (ended, -1)))
        peak = running = 0
        over = busy = 0.0
        for index, (when, step) in enumerate(edges):
            later = edges[index + 1][0] if index + 1 < len(edges) else when
            running += step
            peak = max(peak, running)
            busy += running * (later - when)
            if running > bound:
                over += later - when
        span = edges[-1][0] - edges[0][0] if edges else 0.0
        return cls(peak, over, busy / span if span else 0.0, busy)


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
