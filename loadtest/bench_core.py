"""Figures for the core: a cold-key stampede across processes, and the warm hit path.

    python loadtest/bench_core.py            # starts a throwaway server on 127.0.0.1
    python loadtest/bench_core.py --quick    # one round of each, for CI

1. ``--processes`` x ``--threads`` callers on one cold key, the loader sleeping ``--delay``:
   loader calls, the slowest caller, and the commands sent to Redis (MONITOR, scripts'
   inner commands excluded), for stampede and for the textbook 100 ms sleep-spin lock.
   The same callers reading a warm key give the floor this machine adds to any call.
2. Warm hits in one thread: stampede's calls/s against raw redis-py GET + orjson.loads of
   the same value, in interleaved rounds (alternating which goes first) in the same run;
   the median of the per-round ratios is the figure.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis

from stampede import Stampede
from stampede.demo import run_processes
from stampede.testing import CommandMonitor, names, server_url

NOT_CACHE_TRAFFIC = {"INCR", "ECHO", "PING"}  # the demo's query log, markers, warm-up


def cold_key_stampede(url: str, options: argparse.Namespace) -> None:
    rounds: dict[str, list[dict[str, Any]]] = {"stampede": [], "sleep-spin": [], "warm floor": []}
    client = redis.Redis.from_url(url)
    with CommandMonitor(url) as monitor:
        for _ in range(options.rounds):
            for strategy in ("stampede", "sleep-spin"):
                figures = run_processes(url, strategy, options.processes, options.threads, options.delay,
                                        on_ready=monitor.checkpoint)  # fmt: skip
                sent = [name for name in names(monitor.checkpoint()) if name not in NOT_CACHE_TRAFFIC]
                figures["commands"] = len(sent) - 1  # minus run_processes' read of the query log
                rounds[strategy].append(figures)
            client.set("demo:off:warm", orjson.dumps({"categories": ["books", "games"], "key": "warm"}))
            rounds["warm floor"].append(
                run_processes(url, "off", options.processes, options.threads, options.delay, key="warm")
            )
    client.close()

    callers = options.processes * options.threads
    print(f"\n1. Cold key: {options.processes} processes x {options.threads} threads = {callers} callers, "
          f"loader {options.delay * 1000:.0f} ms, {options.rounds} round(s)")  # fmt: skip
    header = ("", "loader calls", "slowest ms", "median round", "over loader", "commands", "per process")
    print("   {:<12} {:>12} {:>11} {:>13} {:>12} {:>9} {:>12}".format(*header))
    for name, results in rounds.items():
        slowest = [max(r["latencies"]) * 1000 for r in results]
        loaded = name != "warm floor"
        commands = max(r.get("commands", 0) for r in results)
        print("   {:<12} {:>12} {:>11.1f} {:>13.1f} {:>+12.1f} {:>9} {:>12}".format(
            name,
            max(r["queries"] for r in results),
            max(slowest),
            statistics.median(slowest),
            max(slowest) - (options.delay * 1000 if loaded else 0),
            commands if loaded else "-",
            f"{commands / options.processes:.1f}" if loaded else "-",
        ))  # fmt: skip
    print("   (slowest: the worst round; commands: the worst round, MONITOR, scripts' inner commands excluded)")
    assert all(r["queries"] == 1 for r in rounds["stampede"]), "stampede let more than one load through"


def warm_hits(url: str, options: argparse.Namespace) -> None:
    value = {"id": 42, "name": "category map", "children": [{"id": i, "name": f"c{i}"} for i in range(20)]}
    client = redis.Redis.from_url(url, socket_timeout=5)
    client.set("bench:raw", orjson.dumps(value))
    with Stampede.from_url(url, namespace="bench") as layer:

        @layer.cached_loader("item:{item_id}", ttl=3600)
        def load(item_id: int) -> dict[str, Any]:
            return value

        assert load(42) == value  # now warm

        def raw() -> None:
            for _ in range(options.calls):
                orjson.loads(client.get("bench:raw"))  # type: ignore[arg-type]

        def cached() -> None:
            for _ in range(options.calls):
                load(42)

        def rate(run: Callable[[], None]) -> float:
            start = time.perf_counter()
            run()
            return options.calls / (time.perf_counter() - start)

        ratios, raw_rates, cached_rates = [], [], []
        for round_number in range(options.hit_rounds):
            if round_number % 2:  # alternate which goes first, so drift favours neither
                cached_rate, raw_rate = rate(cached), rate(raw)
            else:
                raw_rate, cached_rate = rate(raw), rate(cached)
            raw_rates.append(raw_rate)
            cached_rates.append(cached_rate)
            ratios.append(cached_rate / raw_rate)
        assert layer.stats()["loads"] == 1
    client.close()
    print(f"\n2. Warm hit path, one thread, {options.hit_rounds} interleaved rounds of {options.calls} calls")
    print(f"   raw GET + orjson.loads  {statistics.median(raw_rates):>9.0f} calls/s (median)")
    print(f"   stampede cached_loader  {statistics.median(cached_rates):>9.0f} calls/s (median)")
    spread = f"min {min(ratios):.3f}, max {max(ratios):.3f}"
    print(f"   ratio                   {statistics.median(ratios):>9.3f} (median; {spread})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--hit-rounds", type=int, default=21)
    parser.add_argument("--quick", action="store_true", help="one round, fewer calls (CI)")
    options = parser.parse_args()
    if options.quick:
        options.rounds, options.calls, options.hit_rounds = 1, 1000, 3
    with server_url(options.redis) as url:
        cold_key_stampede(url, options)
        warm_hits(url, options)


if __name__ == "__main__":
    main()
