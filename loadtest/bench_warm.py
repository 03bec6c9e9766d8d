"""Figures for a warm start (``hot_sample``, ``Stampede.warm``): a fleet booting on an empty
cache with a recorded hot set, warming together, against the same fleet starting cold.

    python loadtest/bench_warm.py            # starts the server it needs on 127.0.0.1
    python loadtest/bench_warm.py --quick    # 5 s windows, for CI

First a hot set is recorded: every one of ``--keys`` keys called, most of them many
times (a Zipf law), by a loader with ``hot_sample=1``. Then, for each way, the values are
dropped (the hot set stays), and ``--processes`` processes boot together, a loader of
``--delay`` seconds and ``max_concurrent_loads=--budget`` each, which counts in the
server the loads running at once and each key's loads:

- ``warm start``: each process calls ``layer.warm(load, count=--keys)``, then serves;
- ``cold start``: each process serves at once.

Serving is ``--threads`` threads reading Zipf-drawn keys for two windows of ``--seconds``:
the p99 of the first window (the boot), and of the second (the fleet warm); also the p99
of the first 5 s and the slowest call of the first window, where a cold start's misses
show (over a minute of hits they are under 1% of the calls). The script
exits 1 if the warm start loads a key twice, runs more loads at once than the budget, or
(not in the short form) its first window's p99 is past 2x its second's. Its last line is
the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import uuid
from typing import Any

import redis
from fleet import count_keys, counted, counted_query, run_processes

from stampede import Stampede
from stampede.testing import server_url

WAYS = ["warm start", "cold start"]
EARLY = 5.0  # seconds: the start of the first window, where a cold start's misses are


def zipf(keys: int, count: int, draw: random.Random) -> list[int]:
    weights = [1 / (rank + 1) for rank in range(keys)]
    return draw.choices(range(keys), weights, k=count)


def p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0


def worker(options: argparse.Namespace) -> None:
    """One process of the fleet: boot (warm or not), then serve two windows."""
    layer = Stampede.from_url(
        options.url, namespace=options.namespace, max_concurrent_loads=options.budget, wait_timeout=120
    )
    load = layer.cached_loader("item:{key}")(counted_query(options.url, options.namespace, options.delay))
    layer.cached_loader("ready:{key}", max_concurrent_loads=0)(lambda key: key)(0)  # connections open first
    seeds = [options.seed * 100 + number for number in range(options.threads)]
    draws = [zipf(options.keys, 200_000, random.Random(seed)) for seed in seeds]
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    began = time.monotonic()
    report = layer.warm(load, count=options.keys, concurrency=8) if options.way == "warm start" else None
    warmed = time.monotonic()
    windows: list[list[float]] = [[], []]
    early: list[float] = []  # the calls of the first EARLY seconds, within the first window
    wrong = [0]

    def serve(number: int) -> None:
        for key in draws[number]:
            start = time.monotonic()
            window = int((start - warmed) // options.seconds)
            if window > 1:
                return
            if load(key) != {"id": key}:
                wrong[0] += 1
            took = time.monotonic() - start
            windows[window].append(took)
            if start - warmed < EARLY:
                early.append(took)

    threads = [threading.Thread(target=serve, args=(number,)) for number in range(options.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    layer.close()
    print(json.dumps({
        "boot": warmed - began, "loaded": report.loaded if report else 0, "wrong": wrong[0],
        "first": p99(windows[0]), "second": p99(windows[1]), "calls": len(windows[0]) + len(windows[1]),
        "early": p99(early), "slowest": max(windows[0], default=0.0),
    }), flush=True)  # fmt: skip


def record(url: str, namespace: str, keys: int) -> int:
    """The hot set: every key called, most many times. Returns its size as the store keeps it."""
    layer = Stampede.from_url(url, namespace=namespace)
    try:
        load = layer.cached_loader("item:{key}", hot_sample=1.0)(lambda key: {"id": key})
        for key in [*range(keys), *zipf(keys, keys * 10, random.Random(0))]:
            load(key)
        layer.flush_hot_sets()
        from stampede._warming import hot_calls

        return len(hot_calls(layer.store(), load.hot_set, keys, time.time()))
    finally:
        layer.close()


def go_cold(url: str, namespace: str, keys: int) -> None:
    """Drop every value (the hot set stays) and the counts of the last way."""
    layer = Stampede.from_url(url, namespace=namespace)
    try:
        load = layer.cached_loader("item:{key}")(lambda key: {"id": key})
        for key in range(keys):
            load.invalidate(key)
    finally:
        layer.close()
    redis.Redis.from_url(url).delete(*count_keys(namespace))


def run_way(url: str, namespace: str, way: str, options: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--worker", "--url", url, "--way", way, "--namespace", namespace,
               "--threads", str(options.threads), "--keys", str(options.keys), "--delay", str(options.delay),
               "--budget", str(options.budget), "--seconds", str(options.seconds)]  # fmt: skip
    results = run_processes(command, options.processes, 2 * options.seconds + 300)
    peak, loads = counted(url, namespace)
    per_key = list(loads.values())
    return {
        "boot_s": max(result["boot"] for result in results),
        "loads": sum(per_key),
        "max_per_key": max(per_key, default=0),
        "peak": peak,
        "p99_first_ms": 1000 * max(result["first"] for result in results),
        "p99_second_ms": 1000 * max(result["second"] for result in results),
        "p99_early_ms": 1000 * max(result["early"] for result in results),
        "slowest_ms": 1000 * max(result["slowest"] for result in results),
        "wrong": sum(result["wrong"] for result in results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a Redis server to use (default: one started here)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--delay", type=float, default=0.01)
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0, help="each window of serving")
    parser.add_argument("--quick", action="store_true", help="5 s windows, 300 keys")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker(options)
        return 0
    if options.quick:
        options.seconds, options.keys = 5.0, 300
    failures: list[str] = []
    figures: dict[str, dict[str, Any]] = {}
    with server_url(options.url) as url:
        namespace = f"warm-{uuid.uuid4().hex[:8]}"
        recorded = record(url, namespace, options.keys)
        print(f"Warm start: a hot set of {recorded} keys; {options.processes} processes x {options.threads} "
              f"threads boot on an empty cache, loader {options.delay * 1000:.0f} ms, budget {options.budget}, "
              f"windows of {options.seconds:.0f} s")  # fmt: skip
        print(f"   {'':12} {'boot s':>7} {'loads':>6} {'max/key':>8} {'peak':>5} {'p99 1st ms':>11} {'p99 2nd ms':>11}"
              f" {'p99 5 s ms':>11} {'slowest ms':>11}")  # fmt: skip
        for way in WAYS:
            go_cold(url, namespace, options.keys)
            row = figures[way] = run_way(url, namespace, way, options)
            print(f"   {way:12} {row['boot_s']:7.2f} {row['loads']:6} {row['max_per_key']:8} {row['peak']:5} "
                  f"{row['p99_first_ms']:11.2f} {row['p99_second_ms']:11.2f} {row['p99_early_ms']:11.2f} "
                  f"{row['slowest_ms']:11.2f}", flush=True)  # fmt: skip
        warm, cold = figures["warm start"], figures["cold start"]
        ratio = warm["p99_first_ms"] / max(warm["p99_second_ms"], 1e-9)
        cold_ratio = cold["p99_first_ms"] / max(cold["p99_second_ms"], 1e-9)
        print(f"   warm start: the first window's p99 is {ratio:.2f}x the second's (cold start: {cold_ratio:.2f}x)")
        failures += [f"{way}: a caller got a wrong value" for way, row in figures.items() if row["wrong"]]
        if warm["max_per_key"] > 1:
            failures.append(f"warm start: a key was loaded {warm['max_per_key']} times")
        if warm["peak"] > options.budget:
            failures.append(f"warm start: {warm['peak']} loads at once, over the budget of {options.budget}")
        if warm["loads"] != recorded:
            failures.append(f"warm start: {warm['loads']} loads for a hot set of {recorded} keys")
        if not options.quick and ratio > 2:
            failures.append(f"warm start: the first window's p99 is {ratio:.2f}x the second's, past 2x")
    for failure in failures:
        print("FAILED:", failure)
    print(json.dumps({"recorded": recorded, "figures": figures, "first_over_second": ratio}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
