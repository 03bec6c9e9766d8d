"""The stampede, side by side: processes x threads hammer one cold key of a slow database.

    python -m stampede demo                      # starts a throwaway server on 127.0.0.1
    python -m stampede demo --redis redis://127.0.0.1:6379/0

(``stampede demo`` with the console script, or ``python examples/demo.py``.)

Three ways to read through the cache, each on a fresh cold key:

* off        cache-aside with no protection: GET, and on a miss query and SET
* sleep-spin the textbook lock: SET NX, and the losers poll every 100 ms
* stampede   @cached_loader: in-process singleflight, lease lock, pub/sub wake-up

The "database" counts its queries on the server (INCR), so the count spans processes.
With no server binary at hand (and no --redis), it runs threads of one process on the
embedded backend instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import redis

from . import Stampede
from ._redact import redacted
from .testing import RedisServer, find_server_binary

STRATEGIES = ("off", "sleep-spin", "stampede")


def make_reader(strategy: str, url: str | None, delay: float, queries: Callable[[str], object]) -> Callable[[str], Any]:
    """A function that reads a key through the cache with the given strategy."""

    def query_database(key: str) -> dict[str, Any]:
        queries(key)
        time.sleep(delay)
        return {"categories": ["books", "games"], "key": key}

    if strategy == "stampede":
        layer = Stampede.from_url(url, namespace="demo") if url else Stampede(namespace="demo")

        @layer.cached_loader("category-map:{name}", ttl=60)
        def category_map(name: str) -> dict[str, Any]:
            return query_database(name)

        return category_map

    assert url is not None
    client = redis.Redis.from_url(url, socket_timeout=5)

    def off(key: str) -> Any:
        cache_key = f"demo:{strategy}:{key}"
        cached = client.get(cache_key)
        if cached is not None:
            return orjson.loads(cached)
        value = query_database(key)
        client.set(cache_key, orjson.dumps(value), ex=60)
        return value

    def sleep_spin(key: str) -> Any:
        cache_key = f"demo:{strategy}:{key}"
        while True:
            cached = client.get(cache_key)
            if cached is not None:
                return orjson.loads(cached)
            if client.set(cache_key + ":lock", "1", nx=True, px=10_000):
                value = query_database(key)
                client.set(cache_key, orjson.dumps(value), ex=60)
                client.delete(cache_key + ":lock")
                return value
            time.sleep(0.1)

    return off if strategy == "off" else sleep_spin


def run_threads(read: Callable[[str], Any], key: str, threads: int) -> dict[str, Any]:
    """Every thread reads once, all released together. Returns latencies in seconds."""
    barrier = threading.Barrier(threads)
    latencies: list[float] = []
    values: list[Any] = []
    lock = threading.Lock()

    def one() -> None:
        barrier.wait()
        start = time.perf_counter()
        value = read(key)
        elapsed = time.perf_counter() - start
        with lock:
            latencies.append(elapsed)
            values.append(value)

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return {"latencies": latencies, "consistent": all(v == values[0] for v in values)}


def worker_main(options: argparse.Namespace) -> None:
    """One process of a run: ready, wait for go, read, print JSON."""
    counter = redis.Redis.from_url(options.redis, socket_timeout=5)
    read = make_reader(options.strategy, options.redis, options.delay, lambda key: counter.incr(f"demo:queries:{key}"))
    # A warm-up stampede on another key opens every connection and loads the scripts,
    # so the figures measure the protocol, not connection set-up.
    run_threads(read, "warm-up-" + options.key, options.threads)
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(run_threads(read, options.key, options.threads)), flush=True)


def run_workers(command: list[str], processes: int, on_ready: Callable[[], None]) -> list[dict[str, Any]]:
    """Start ``processes`` copies of ``command`` (each prints "ready", waits for a line on
    stdin, then prints its result as a JSON line), let them go at once, and return their
    results. ``on_ready`` runs just before the go. Every process is gone on return."""
    started = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(processes)]  # fmt: skip
    try:
        for process in started:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        on_ready()
        for process in started:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        return [json.loads(process.communicate(timeout=60)[0].splitlines()[-1]) for process in started]
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait(5)


def run_processes(
    url: str,
    strategy: str,
    processes: int,
    threads: int,
    delay: float,
    key: str | None = None,
    on_ready: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """One stampede of ``processes`` x ``threads`` callers on ``key`` (default: a fresh
    cold one). ``on_ready`` runs when every process is warmed up, just before the go."""
    key = key or uuid.uuid4().hex[:12]
    command = [sys.executable, "-m", "stampede.demo", "--worker", "--redis", url, "--strategy", strategy,
               "--key", key, "--threads", str(threads), "--delay", str(delay)]  # fmt: skip
    results = run_workers(command, processes, on_ready)
    client = redis.Redis.from_url(url)
    queries = int(client.get(f"demo:queries:{key}") or 0)
    client.close()
    latencies = [latency for result in results for latency in result["latencies"]]
    return {"queries": queries, "latencies": latencies, "consistent": all(r["consistent"] for r in results)}


def run_embedded(strategy: str, threads: int, delay: float) -> dict[str, Any]:
    """Without a server: threads of this process, embedded backend, stampede only."""
    queries = [0]
    lock = threading.Lock()

    def count(key: str) -> None:
        with lock:
            queries[0] += 1

    result = run_threads(make_reader(strategy, None, delay, count), uuid.uuid4().hex, threads)
    return {"queries": queries[0], **result}


def report(rows: list[tuple[str, dict[str, Any]]], delay: float) -> None:
    print(f"\n{'strategy':<12} {'db queries':>10} {'p50 ms':>8} {'max ms':>8}", end="   ")
    print(f"(database query takes {delay * 1000:.0f} ms)")
    for name, figures in rows:
        latencies = sorted(figures["latencies"])
        print(f"{name:<12} {figures['queries']:>10} {statistics.median(latencies) * 1000:>8.1f} "
              f"{latencies[-1] * 1000:>8.1f}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="stampede demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds one database query takes")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", choices=STRATEGIES, help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.worker:
        worker_main(options)
        return

    callers = options.processes * options.threads
    if options.redis is None and find_server_binary() is None:
        print(f"No Redis server found: {options.threads} threads of one process, embedded backend.")
        report([("stampede", run_embedded("stampede", options.threads, options.delay))], options.delay)
        return
    server = None if options.redis else RedisServer().start()
    url = options.redis or server.url  # type: ignore[union-attr]
    try:
        print(f"{options.processes} processes x {options.threads} threads = {callers} callers on one cold key, "
              f"server {redacted(url)}")  # fmt: skip
        rows = [(name, run_processes(url, name, options.processes, options.threads, options.delay))
                for name in STRATEGIES]  # fmt: skip
    finally:
        if server is not None:
            server.stop()
    report(rows, options.delay)
    assert all(figures["consistent"] for _, figures in rows), "callers saw different values"


if __name__ == "__main__":
    main()
