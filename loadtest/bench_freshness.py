"""Figures for freshness: an expiry storm on hot keys, and a database outage inside it.

    python loadtest/bench_freshness.py           # starts a throwaway server on 127.0.0.1
    python loadtest/bench_freshness.py --quick   # a short run, for CI
    python loadtest/bench_freshness.py --plot loadtest/figures/freshness.png   # and its picture

``--processes`` x ``--threads`` callers each call one of ``--keys`` hot keys, pausing
``--pause`` between calls, for ``--seconds``; values live ``--ttl``; the loader sleeps
``--delay``. The same storm runs, in the same run and on the same server, against:

* stampede with today's defaults (every caller after an expiry waits for the one load);
* stampede with ``stale_while_revalidate`` and ``early_refresh``, then with
  ``stale_if_error`` as well (its hits may need to know whether the loader is failing);
* dogpile.cache (if installed): a region on its Redis backend with
  ``distributed_lock=True`` and Redis keeping values past dogpile's expiry, so that it
  serves the old value while one caller regenerates;
* stampede with ``stale_if_error`` as well, the loader raising for ``--outage`` seconds
  in the middle of the storm.

For each: latency percentiles of the calls after the first ttl (the warm-up), loads per
key per expiry (``SAME_EXPIRY`` says when two loads are for the same one), the shortest
gap between two loads of a key, errors seen by callers; for the outage, the loader's attempts while the
database was down and the time from its recovery to the new value. Last, what the
freshness settings cost a warm hit (``hit_cost``), and the server commands per call
(``INFO commandstats``: in the storm, and per warm hit).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from expiry_windows import expiry_windows, summarize
from plots import Panel, draw

from stampede import Stampede
from stampede.testing import server_url

CONFIGS = {
    "stampede, defaults": {},
    "stampede, swr + early": {"stale_while_revalidate": 2.0, "early_refresh": 1.0},
    "stampede, + stale_if_error": {"stale_while_revalidate": 2.0, "early_refresh": 1.0, "stale_if_error": 30.0},
    "dogpile.cache": None,
    "stampede, + stale_if_error, outage": {"stale_while_revalidate": 2.0, "early_refresh": 1.0,
                                           "stale_if_error": 30.0, "stale_retry_interval": 1.0},
}  # fmt: skip


# Two loads of a key are for the same expiry when the second starts while the first runs
# or within this long after it ended: its caller decided to load on the old value, before
# the first load's write, and a lock, a read or a thread start later it loads. A refresh
# of the new value starts later: XFetch draws how much earlier than the expiry, and with
# hundreds of hits a second on a key whose last load was slow it may draw half a ttl.
# (The Locust run's rule, a window lasting the value's whole ttl, would count those.)
SAME_EXPIRY = 0.1


@dataclass
class Query:
    started: float
    finished: float
    what: str
    failed: bool = False


def worker(spec: dict[str, Any]) -> None:
    """One process of the storm: prints "ready", waits for "go", prints one JSON line.
    Failed refreshes during the outage are counted, not logged."""
    logging.getLogger("stampede").setLevel(logging.ERROR)
    name, ttl, delay = spec["config"], spec["ttl"], spec["delay"]
    down_from, down_until = spec.get("down_from", 0.0), spec.get("down_until", 0.0)
    log: list[Query] = []
    log_lock = threading.Lock()

    def database(key: int) -> dict[str, Any]:
        started = time.time()
        time.sleep(delay)
        failed = down_from <= started < down_until
        with log_lock:
            log.append(Query(started, time.time(), str(key), failed))
        if failed:
            raise ConnectionError("the database is down")
        return {"key": key, "loaded_at": started}

    if CONFIGS[name] is None:
        load, close = _dogpile(spec["url"], ttl, database)
    else:
        layer = Stampede.from_url(spec["url"], namespace="fresh", ttl=ttl, **CONFIGS[name])
        load, close = layer.cached_loader("hot:{key}")(database), layer.close
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    begin = spec["begin"]
    end = begin + spec["seconds"]
    calls: list[tuple[float, float]] = []  # (when, seconds)
    errors = [0]
    results_lock = threading.Lock()

    def caller(index: int) -> None:
        time.sleep(max(0.0, begin - time.time()) + index * spec["pause"] / spec["threads"])
        step = index
        while (now := time.time()) < end:
            key = step % spec["keys"]
            step += 1
            started = time.perf_counter()
            try:
                load(key)
            except Exception:
                with results_lock:
                    errors[0] += 1
            with results_lock:
                calls.append((now, time.perf_counter() - started))
            time.sleep(spec["pause"])

    threads = [threading.Thread(target=caller, args=(index,)) for index in range(spec["threads"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(delay * 2)  # let a refresh in flight log its query
    close()
    with log_lock:
        queries = [vars(query) for query in log]
    print(json.dumps({"calls": calls, "errors": errors[0], "queries": queries}), flush=True)


def _dogpile(url: str, ttl: float, database: Any) -> tuple[Any, Any]:
    from dogpile.cache import make_region

    region = make_region().configure(
        "dogpile.cache.redis",
        expiration_time=ttl,
        arguments={"url": url, "distributed_lock": True, "redis_expiration_time": int(ttl * 60) + 1,
                   "lock_timeout": 10, "thread_local_lock": False},
    )  # fmt: skip

    def load(key: int) -> Any:
        return region.get_or_create(f"hot:{key}", lambda: database(key))

    return load, lambda: None


def server_commands(client: redis.Redis) -> int:
    """Commands the server has run since its statistics were last reset (INFO
    commandstats: every command, those a script runs included)."""
    stats: dict[str, Any] = client.info("commandstats")  # type: ignore[assignment]
    return sum(int(entry["calls"]) for name, entry in stats.items() if name.startswith("cmdstat_"))


def storm(url: str, config: str, options: argparse.Namespace) -> dict[str, Any]:
    server = redis.Redis.from_url(url)
    server.flushall()
    server.config_resetstat()
    spec = {"url": url, "config": config, "ttl": options.ttl, "delay": options.delay, "keys": options.keys,
            "threads": options.threads, "pause": options.pause, "seconds": options.seconds}  # fmt: skip
    processes = []
    try:
        for _ in range(options.processes):
            process = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)  # fmt: skip
            processes.append(process)
        begin = time.time() + 1.0
        if "outage" in config:
            middle = begin + options.seconds / 2
            spec.update(down_from=middle - options.outage / 2, down_until=middle + options.outage / 2)
        spec["begin"] = begin
        for process in processes:
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(json.dumps(spec) + "\n")
            process.stdin.flush()
            assert process.stdout.readline().strip() == "ready"
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        outputs = [json.loads(process.communicate(timeout=options.seconds + 60)[0].splitlines()[-1])
                   for process in processes]  # fmt: skip
    finally:
        for process in processes:  # ours, by PID: never left behind
            if process.poll() is None:
                process.kill()
                process.wait(5)
    result = figures(spec, outputs, options)
    result["cmds/call"] = server_commands(server) / max(1, sum(len(output["calls"]) for output in outputs))
    return result


def figures(spec: dict[str, Any], outputs: list[dict[str, Any]], options: argparse.Namespace) -> dict[str, Any]:
    warm = spec["begin"] + options.ttl
    latencies = sorted(seconds for output in outputs for when, seconds in output["calls"] if when >= warm)
    queries = [Query(**query) for output in outputs for query in output["queries"]]
    windows = summarize(expiry_windows(queries, SAME_EXPIRY))
    result: dict[str, Any] = {
        "calls": len(latencies),
        "p50": _percentile(latencies, 50) * 1000,
        "p99": _percentile(latencies, 99) * 1000,
        "max": latencies[-1] * 1000 if latencies else 0.0,
        "errors": sum(output["errors"] for output in outputs),
        "loads": len(queries),
        "max per window": windows["max_queries_per_window"],
        "windows with 2+": windows["windows_with_more_than_one_query"],
        "same-expiry loads": close_loads(queries, SAME_EXPIRY),
        "min gap ms": min_gap(queries) * 1000,
    }
    if "down_from" in spec:
        down_from, down_until = spec["down_from"], spec["down_until"]
        result["attempts while down"] = sum(1 for query in queries if query.failed)
        recovered = {}
        for query in sorted(queries, key=lambda query: query.finished):
            if query.started >= down_until and not query.failed:
                recovered.setdefault(query.what, query.finished - down_until)
        # A key not reloaded before the run ended counts as the rest of the run.
        missing = options.keys - len(recovered)
        rest = spec["begin"] + options.seconds - down_until
        result["recovery s"] = max([*recovered.values(), *([rest] * missing)], default=rest)
        result["keys not reloaded"] = missing
        result["outage s"] = down_until - down_from
    return result


def hit_cost(url: str, options: argparse.Namespace) -> dict[str, float]:
    """What freshness costs a hit: one thread, a plain loader's hits (GET) against the same
    value's hits with stale_while_revalidate (the script that reads it with its TTL), in
    interleaved rounds; the median of the per-round ratios."""
    value = {"id": 42, "children": [{"id": i, "name": f"c{i}"} for i in range(20)]}
    with Stampede.from_url(url, namespace="hitcost", ttl=3600) as layer:
        plain = layer.cached_loader("plain:{key}")(lambda key: value)
        fresh = layer.cached_loader("fresh:{key}", stale_while_revalidate=60, early_refresh=1.0)(lambda key: value)
        failing = layer.cached_loader("failing:{key}", stale_while_revalidate=60, stale_if_error=600)(lambda key: value)
        plain(1), fresh(1)  # warm

        def rate(load: Any) -> float:
            started = time.perf_counter()
            for _ in range(options.hit_calls):
                load(1)
            return options.hit_calls / (time.perf_counter() - started)

        server = redis.Redis.from_url(url)
        per_hit = {}
        for name, load in (("plain", plain), ("fresh", fresh), ("fresh + stale_if_error", failing)):
            load(1)  # warm
            server.config_resetstat()
            for _ in range(1000):
                load(1)
            per_hit[name] = (server_commands(server) - 1) / 1000  # the INFO itself is one
        ratios, plain_rates, fresh_rates = [], [], []
        for round_number in range(options.hit_rounds):
            first, second = (plain, fresh) if round_number % 2 else (fresh, plain)
            rates = {id(first): rate(first), id(second): rate(second)}
            plain_rates.append(rates[id(plain)])
            fresh_rates.append(rates[id(fresh)])
            ratios.append(rates[id(fresh)] / rates[id(plain)])
        assert layer.stats()["loads"] == 3
    return {"plain": statistics.median(plain_rates), "fresh": statistics.median(fresh_rates),
            "ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "commands per hit": per_hit}  # fmt: skip


def _by_key(queries: list[Query]) -> dict[str, list[Query]]:
    by_key: dict[str, list[Query]] = {}
    for query in sorted(queries, key=lambda query: query.started):
        by_key.setdefault(query.what, []).append(query)
    return by_key


def min_gap(queries: list[Query]) -> float:
    """The shortest time from a load's end to the start of the next load of its key."""
    gaps = [b.started - a.finished for logged in _by_key(queries).values() for a, b in itertools.pairwise(logged)]
    return min(gaps, default=0.0)


def close_loads(queries: list[Query], within: float) -> list[dict[str, Any]]:
    """Each load of a key that started less than ``within`` after the key's previous load
    finished (negative: while it ran), with both loads' durations: a second load for the
    same expiry."""
    close = []
    for key, logged in _by_key(queries).items():
        for previous, query in itertools.pairwise(logged):
            gap = query.started - previous.finished
            if gap < within:
                close.append({"key": key, "gap ms": round(gap * 1000, 1),
                              "previous ms": round((previous.finished - previous.started) * 1000, 1),
                              "ms": round((query.finished - query.started) * 1000, 1)})  # fmt: skip
    return close


def _percentile(ordered: list[float], percent: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(len(ordered) * percent / 100))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help="a Redis to use (default: start one on 127.0.0.1)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--ttl", type=float, default=1.0)
    parser.add_argument("--delay", type=float, default=0.05, help="the loader's seconds")
    parser.add_argument("--pause", type=float, default=0.01, help="seconds between a caller's calls")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--outage", type=float, default=3.0, help="seconds the database is down")
    parser.add_argument("--hit-calls", type=int, default=3000, help="calls per round of the hit-cost figure")
    parser.add_argument("--hit-rounds", type=int, default=21)
    parser.add_argument("--quick", action="store_true", help="2 processes x 4 threads for 4 s (CI)")
    parser.add_argument("--plot", help="also draw the storm's figures beside dogpile.cache's to this PNG")
    options = parser.parse_args()
    if options.worker:
        worker(json.loads(sys.stdin.readline()))
        return
    if options.quick:
        options.processes, options.threads, options.seconds, options.outage = 2, 4, 4.0, 1.0
        options.hit_calls, options.hit_rounds = 500, 3
    try:
        import dogpile.cache
    except ImportError:
        print("dogpile.cache is not installed (pip install -e '.[loadtest]'): its row is left out")
        del CONFIGS["dogpile.cache"]
    print(f"Expiry storm: {options.processes} processes x {options.threads} threads, {options.keys} hot keys, "
          f"ttl {options.ttl:g} s, loader {options.delay * 1000:.0f} ms, {options.pause * 1000:.0f} ms between "
          f"calls, {options.seconds:g} s; latencies after the first ttl")  # fmt: skip
    rows = {}
    with server_url(options.url) as url:
        for config in CONFIGS:
            rows[config] = storm(url, config, options)
        cost = hit_cost(url, options)
    header = ("", "calls", "p50 ms", "p99 ms", "max ms", "errors", "loads", "max/expiry", "2+ expiries", "min gap ms",
              "cmds/call")  # fmt: skip
    print("{:<36} {:>7} {:>7} {:>7} {:>8} {:>7} {:>6} {:>11} {:>12} {:>11} {:>9}".format(*header))
    for config, row in rows.items():
        cells = (row["calls"], row["p50"], row["p99"], row["max"], row["errors"], row["loads"],
                 row["max per window"], row["windows with 2+"], row["min gap ms"], row["cmds/call"])  # fmt: skip
        print("{:<36} {:>7} {:>7.2f} {:>7.2f} {:>8.1f} {:>7} {:>6} {:>11} {:>12} {:>11.1f} {:>9.2f}".format(
            config, *cells))  # fmt: skip
    for config, row in rows.items():
        for load in row["same-expiry loads"]:
            print(f"  {config}: key {load['key']} loaded again {load['gap ms']} ms after a load of "
                  f"{load['previous ms']} ms finished (this one {load['ms']} ms)")  # fmt: skip
    outage = rows["stampede, + stale_if_error, outage"]
    print(f"Outage of {outage['outage s']:.1f} s inside the storm: {outage['errors']} errors to callers, "
          f"{outage['attempts while down']} loader attempts while down ({options.keys} keys), "
          f"new value {outage['recovery s']:.2f} s after recovery (slowest key; "
          f"{outage['keys not reloaded']} not reloaded before the run ended)")  # fmt: skip
    dogpile = rows.get("dogpile.cache")
    fresh = rows["stampede, swr + early"]
    if dogpile is not None and dogpile["p99"] > 0:
        print(f"p99 ratio, stampede swr + early / dogpile.cache: {fresh['p99'] / dogpile['p99']:.2f}")
    print(f"Warm hit, one thread, {options.hit_rounds} interleaved rounds of {options.hit_calls} calls: plain loader "
          f"{cost['plain']:.0f} calls/s, with freshness settings {cost['fresh']:.0f} calls/s, ratio "
          f"{cost['ratio']:.3f} (median; min {cost['min']:.3f}, max {cost['max']:.3f})")  # fmt: skip
    print("Server commands per warm hit (INFO commandstats, 1000 hits): "
          + ", ".join(f"{name} {count:.2f}" for name, count in cost["commands per hit"].items()))  # fmt: skip
    print(json.dumps({"figures": rows, "hit cost": cost}))
    if options.plot:
        plot(rows, options, options.plot)
        print(f"plot: {options.plot}")


def plot(rows: dict[str, dict[str, Any]], options: argparse.Namespace, path: str) -> None:
    """One PNG of the storm without the outage: each configuration's p50 and p99 latency,
    and its loads per key per expiry at most, side by side (dogpile.cache's beside
    stampede's, measured in the same run on the same server)."""
    names = [name for name in rows if "outage" not in name]
    quantiles = [(q, [rows[name][q] for name in names]) for q in ("p50", "p99")]
    latency = Panel(names, "latency of a call, ms (lower is better)", quantiles)
    loads = Panel(names, "loads of one key for one expiry, at most (1 is the promise)",
                  [("", [rows[name]["max per window"] for name in names])])  # fmt: skip
    title = (f"Expiry storm: {options.processes} processes x {options.threads} threads, {options.keys} hot keys, "
             f"ttl {options.ttl:g} s, loader {options.delay * 1000:.0f} ms")  # fmt: skip
    draw(path, title, [latency, loads])


if __name__ == "__main__":
    main()
