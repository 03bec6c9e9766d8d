"""Figures for storms of many distinct keys: a fleet-wide load budget (``max_concurrent_loads``)
against no budget and against a per-process limit, side by side in one run.

    python loadtest/bench_fleet.py            # starts the server it needs on 127.0.0.1
    python loadtest/bench_fleet.py --quick    # a smaller fleet and fewer keys, for CI

Storm: the cache is empty (FLUSHALL of the server this script started; a fresh namespace
on one given by ``--url``), then ``--processes`` x ``--threads`` callers walk the
``--keys`` cold keys, each key walked by ``--overlap`` processes (each in an order of its
own, so they collide), each step followed by one read of a key drawn from a Zipf law
(the hot keys asked again and again, by every process). The loader takes ``--delay``
seconds, and each process keeps the start and end of its loads on the machine's one
monotonic clock (``fleet.Timeline``): merged, they give the loads running at every
moment (the peak, and how long more than the budget ran) and each key's loads.

The ways, in interleaved rounds (the worst round shown):

- ``no budget``: stampede collapses each key to one load, and nothing bounds how many
  keys load at once.
- ``per-process limit``: a semaphore of ``--budget`` around each process's loader (what
  a per-host limit gives, Symfony's ``LockRegistry`` for one): the fleet's peak is the
  processes times the limit.
- ``fleet budget``: ``max_concurrent_loads=--budget``, counted across the fleet.
- ``bare semaphore``: the floor a fleet-wide bound has on this machine: ``--budget``
  tokens in a Redis list, each load taking one with BLPOP and giving it back with LPUSH
  (the server wakes the next blocked waiter itself). No fairness, no lease: a holder
  that dies takes its token with it. The fleet budget's wall beside it is what its
  queue, leases and messages cost.

The ideal wall time under a budget is keys x delay / budget; the script exits 1 if the
fleet budget's peak passes the budget, a key is loaded twice, or the wall time is past
``--within`` times the ideal (1.25; not checked in the short form). The table gives the
wall beside that ideal, and beside the loads' own time (their measured seconds summed,
over the budget: what the slots cost besides the loads), with the loads running on
average. Its last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import random
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import redis
from fleet import Running, Timeline, run_processes

from stampede import Stampede
from stampede.testing import server_url

WAYS = ["no budget", "per-process limit", "fleet budget", "bare semaphore"]


def tokens_key(namespace: str) -> str:
    """The bare semaphore's list of tokens."""
    return f"{namespace}:tokens"


def worker(options: argparse.Namespace) -> None:
    """One process of the fleet: ``--threads`` threads walking every key (``--way``)."""
    budget = options.budget if options.way == "fleet budget" else 0
    limit = threading.BoundedSemaphore(options.budget) if options.way == "per-process limit" else None
    layer = Stampede.from_url(options.url, namespace=options.namespace, max_concurrent_loads=budget, wait_timeout=120)
    timeline = Timeline()
    query = timeline.query(options.delay)
    tokens = redis.Redis.from_url(options.url, max_connections=options.threads + 4)

    def limited(key: int) -> dict[str, int]:
        assert limit is not None
        with limit:
            return query(key)

    def bare(key: int) -> dict[str, int]:
        token = tokens.blpop([tokens_key(options.namespace)], timeout=0)[1]
        try:
            return query(key)
        finally:
            tokens.lpush(tokens_key(options.namespace), token)

    bounded = {"per-process limit": limited, "bare semaphore": bare}
    load = layer.cached_loader("item:{key}")(bounded.get(options.way, query))
    warm = layer.cached_loader("warm:{key}", max_concurrent_loads=0)(lambda key: key)
    warming = [
        threading.Thread(target=lambda n: (warm(n), tokens.ping()), args=(number,)) for number in range(options.threads)
    ]
    for thread in warming:  # the pool's connections open and the scripts load before the storm
        thread.start()
    for thread in warming:
        thread.join()
    draw = random.Random(options.seed)
    shards = max(options.processes // options.overlap, 1)
    order = [key for key in range(options.keys) if key % shards == options.seed % shards]
    draw.shuffle(order)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(options.keys)]
    hot = draw.choices(range(options.keys), weights, k=len(order))
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    wrong: list[int] = []
    began = time.monotonic()  # one clock for every process of the machine (CLOCK_MONOTONIC)

    def walk(number: int) -> None:
        for index in range(number, len(order), options.threads):
            for key in (order[index], hot[index]):
                if load(key) != {"id": key}:
                    wrong.append(key)

    threads = [threading.Thread(target=walk, args=(number,)) for number in range(options.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ended = time.monotonic()
    layer.close()
    print(json.dumps({"wrong": len(wrong), "began": began, "ended": ended, "loads": timeline.loads}), flush=True)


def storm(url: str, own_server: bool, options: argparse.Namespace) -> dict[str, dict[str, float]]:
    client = redis.Redis.from_url(url)
    rows: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for number in range(options.rounds):
        for way in WAYS if number % 2 == 0 else list(reversed(WAYS)):
            if own_server:
                client.flushall()
            namespace = f"fleet-{uuid.uuid4().hex[:8]}"
            command = [sys.executable, __file__, "--worker", "--url", url, "--way", way, "--namespace", namespace,
                       "--threads", str(options.threads), "--keys", str(options.keys), "--delay", str(options.delay),
                       "--budget", str(options.budget), "--processes", str(options.processes),
                       "--overlap", str(options.overlap)]  # fmt: skip
            if way == "bare semaphore":
                client.rpush(tokens_key(namespace), *range(options.budget))
            results = run_processes(command, options.processes, 300)
            wall = max(result["ended"] for result in results) - min(result["began"] for result in results)
            loads = [load for result in results for load in result["loads"]]
            per_key = collections.Counter(key for key, _, _ in loads)
            running = Running.of(loads, options.budget)
            rows[way].append({
                "peak": running.peak, "over": running.over, "mean": running.mean, "keys": len(per_key),
                "loads": len(loads), "max_per_key": max(per_key.values(), default=0),
                "load_ms": 1000 * running.busy / max(len(loads), 1), "wall": wall,
                "x_loads": wall / (running.busy / options.budget) if running.busy else 0.0,
                "wrong": sum(result["wrong"] for result in results),
            })  # fmt: skip
    ideal = options.keys * options.delay / options.budget
    print(f"\n1. Storm: {options.processes} processes x {options.threads} threads over {options.keys} cold keys "
          f"(each by {options.overlap} processes, and a Zipf read after each), loader {options.delay * 1000:.0f} ms, "
          f"budget {options.budget}, {options.rounds} interleaved round(s), the worst shown. Ideal wall under the "
          f"budget: {ideal:.2f} s")  # fmt: skip
    header = ("", "peak", "s > budget", "mean running", "keys", "loads", "max per key", "load ms", "wall s",
              "x ideal", "x loads' time")  # fmt: skip
    print("   {:<18} {:>5} {:>10} {:>12} {:>6} {:>6} {:>11} {:>7} {:>7} {:>8} {:>13}".format(*header))
    summary = {}
    for way, results in rows.items():
        worst = {name: max(result[name] for result in results) for name in results[0]}
        worst["mean"] = min(result["mean"] for result in results)
        summary[way] = worst
        row = (
            "   {:<18} {:>5.0f} {:>10.3f} {:>12.2f} {:>6.0f} {:>6.0f} {:>11.0f} {:>7.2f} {:>7.2f} {:>7.2f}x {:>12.2f}x"
        )
        print(row.format(
            way, worst["peak"], worst["over"], worst["mean"], worst["keys"], worst["loads"], worst["max_per_key"],
            worst["load_ms"], worst["wall"], worst["wall"] / ideal, worst["x_loads"]))  # fmt: skip
    return summary


@dataclasses.dataclass
class ProductV1:
    id: int
    name: str
    loaded_at: int


@dataclasses.dataclass
class ProductV2:  # the next deploy renamed a field and added one
    id: int
    title: str
    price: float
    loaded_at: int


def deploy_worker(options: argparse.Namespace) -> None:
    """One version of the application (``--version``): readers over Zipf-drawn keys and an
    invalidator, for ``--seconds``; what each did goes to ``--out`` as JSON."""
    layer = Stampede.from_url(options.url, namespace=options.namespace, ttl=300)
    versioned = not options.unversioned
    loads: list[tuple[int, int, int]] = []  # (key, when its call began, when it read the database)
    lock = threading.Lock()
    call = threading.local()  # when the reader's call that loads began
    if options.version == "v1":

        def query_v1(key: int) -> ProductV1:
            now = time.monotonic_ns()
            with lock:
                loads.append((key, call.began, now))
            return ProductV1(key, f"n{key}", now)

        load: Any = layer.cached_loader("product:{key}", version=versioned)(query_v1)
    else:

        def query_v2(key: int) -> ProductV2:
            now = time.monotonic_ns()
            with lock:
                loads.append((key, call.began, now))
            return ProductV2(key, f"t{key}", 1.5, now)

        load = layer.cached_loader("product:{key}", version=versioned)(query_v2)
    field = "name" if options.version == "v1" else "title"
    draw = random.Random(options.seed)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(options.keys)]
    reads: list[tuple[int, int, int]] = []  # (when it began, key, the value's loaded_at)
    invalidations: list[tuple[int, int, int]] = []  # (key, began, returned)
    failures = {"errors": 0, "wrong_type": 0}
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    deadline = time.monotonic() + options.seconds

    def read(seed: int) -> None:
        local = random.Random(seed)
        while time.monotonic() < deadline:
            key = local.choices(range(options.keys), weights)[0]
            began = call.began = time.monotonic_ns()
            try:
                value = load(key)
            except Exception:
                failures["errors"] += 1
                continue
            if not isinstance(value, dict) or field not in value or value.get("id") != key:
                failures["wrong_type"] += 1
                continue
            reads.append((began, key, value["loaded_at"]))

    def invalidate() -> None:
        while time.monotonic() < deadline:
            time.sleep(options.every)
            key = draw.choices(range(options.keys), weights)[0]
            began = time.monotonic_ns()
            load.invalidate(key)
            invalidations.append((key, began, time.monotonic_ns()))

    threads = [threading.Thread(target=read, args=(options.seed * 100 + n,)) for n in range(options.threads)]
    threads.append(threading.Thread(target=invalidate))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    layer.close()
    with open(options.out, "w") as out:
        json.dump({"reads": reads, "loads": loads, "invalidations": invalidations, **failures}, out)
    print("done", flush=True)


def deploy(url: str, options: argparse.Namespace, versioned: bool = True) -> dict[str, Any]:
    """Two versions side by side on one namespace; their records checked together.
    ``versioned`` False: the same two loaders without ``version=`` (what it prevents)."""
    import tempfile

    namespace = f"deploy-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as folder:
        outs = {version: f"{folder}/{version}.json" for version in ("v1", "v2")}
        started = {
            version: subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--deploy-worker",
                    "--url",
                    url,
                    "--namespace",
                    namespace,
                    "--version",
                    version,
                    "--out",
                    out,
                    "--seconds",
                    str(options.seconds),
                    "--threads",
                    str(options.deploy_threads),
                    "--keys",
                    str(options.deploy_keys),
                    "--every",
                    str(options.every),
                    "--seed",
                    str(number + 1),
                    *([] if versioned else ["--unversioned"]),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for number, (version, out) in enumerate(outs.items())
        }
        try:
            for process in started.values():
                assert process.stdout is not None and process.stdout.readline().strip() == "ready"
            for process in started.values():
                assert process.stdin is not None
                process.stdin.write("go\n")
                process.stdin.flush()
            for process in started.values():
                process.communicate(timeout=options.seconds + 120)
        finally:
            for process in started.values():
                if process.poll() is None:
                    process.kill()
                    process.wait(5)
        records = {version: json.load(open(out)) for version, out in outs.items()}
    invalidated: dict[int, list[tuple[int, int]]] = {}
    for version in records.values():
        for key, began, returned in version["invalidations"]:
            invalidated.setdefault(key, []).append((began, returned))
    for windows in invalidated.values():
        windows.sort()
    row: dict[str, Any] = {}
    for name, version in records.items():
        stale = 0
        for began, key, loaded_at in version["reads"]:
            windows = invalidated.get(key, [])
            before = [start for start, end in windows if end < began]  # invalidations returned before the read
            if before and loaded_at < max(before):
                stale += 1
        most = 0
        loaded: dict[int, list[tuple[int, int]]] = {}
        for key, began, when in version["loads"]:
            loaded.setdefault(key, []).append((began, when))
        for key, spans in loaded.items():
            windows = invalidated.get(key, [])
            edges = [edge for window in windows for edge in window]
            counted: dict[int, int] = {}
            for began, when in spans:
                if any(start <= when and began <= end for start, end in windows):
                    continue  # a load an invalidation overlaps (its call began before it ended): not counted
                span = sum(1 for edge in edges if edge < when)
                counted[span] = counted.get(span, 0) + 1
            most = max([most, *counted.values()])
        row[name] = {
            "reads": len(version["reads"]), "loads": len(version["loads"]), "errors": version["errors"],
            "wrong_type": version["wrong_type"], "stale": stale, "max_loads_per_key_between": most,
            "invalidations": len(version["invalidations"]),
        }  # fmt: skip
    way = "version=True" if versioned else "no version"
    print(f"\n2. Deploy ({way}): v1 and v2 of a loader (a changed dataclass) side by side on one namespace for "
          f"{options.seconds:g} s, {options.deploy_threads} threads each over {options.deploy_keys} keys (Zipf), each "
          f"version invalidating a key every {options.every * 1000:.0f} ms")  # fmt: skip
    header = ("", "reads", "loads", "decode errors", "wrong type", "stale", "max loads/key/window", "invalidations")
    print("   {:<4} {:>8} {:>6} {:>13} {:>10} {:>6} {:>20} {:>13}".format(*header))
    for name, figures in row.items():
        print("   {:<4} {:>8} {:>6} {:>13} {:>10} {:>6} {:>20} {:>13}".format(
            name, figures["reads"], figures["loads"], figures["errors"], figures["wrong_type"], figures["stale"],
            figures["max_loads_per_key_between"], figures["invalidations"]))  # fmt: skip
    print(
        "   (stale: a read begun after an invalidation of its key, by either version, had returned, served a value"
        " loaded before that invalidation began)"
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a Redis server to use (default: one started here)")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--delay", type=float, default=0.01)
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--overlap", type=int, default=2, help="how many processes walk each key")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--within", type=float, help="the fleet budget's wall, at most x ideal (1.25; --quick: none)")
    parser.add_argument("--quick", action="store_true", help="4 processes x 8 threads, 400 keys, one round")
    parser.add_argument("--seconds", type=float, default=60, help="the deploy's run (--quick: 5)")
    parser.add_argument("--deploy-threads", type=int, default=8)
    parser.add_argument("--deploy-keys", type=int, default=200)
    parser.add_argument("--every", type=float, default=0.05, help="seconds between a version's invalidations")
    parser.add_argument("--only", choices=["storm", "deploy"], help="run one part")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--deploy-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--version", choices=["v1", "v2"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--unversioned", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--namespace", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker(options)
        return 0
    if options.deploy_worker:
        deploy_worker(options)
        return 0
    if options.quick:
        options.processes, options.threads, options.keys, options.rounds, options.seconds = 4, 8, 400, 1, 5
    elif options.within is None:
        options.within = 1.25
    failures: list[str] = []
    summary: dict[str, Any] = {}
    deployed: dict[str, Any] = {}
    deployed_without: dict[str, Any] = {}
    ideal = options.keys * options.delay / options.budget
    with server_url(options.url) as url:
        if options.only != "deploy":
            summary = storm(url, options.url is None, options)
            fleet = summary["fleet budget"]
            failures += [f"{way}: a caller got a wrong value" for way, row in summary.items() if row["wrong"]]
            failures += [f"{way}: a key was loaded {row['max_per_key']:.0f} times"
                         for way, row in summary.items() if row["max_per_key"] > 1]  # fmt: skip
            if fleet["peak"] > options.budget:
                failures.append(f"fleet budget: {fleet['peak']:.0f} loads at once, over the budget of {options.budget}")
            if options.within is not None and fleet["wall"] > options.within * ideal:
                failures.append(f"fleet budget: {fleet['wall']:.2f} s, past {options.within}x the ideal {ideal:.2f} s")
        if options.only != "storm":
            deployed = deploy(url, options)
            deployed_without = deploy(url, options, versioned=False)
            for name, row in deployed.items():
                for figure in ("errors", "wrong_type", "stale"):
                    if row[figure]:
                        failures.append(f"deploy {name}: {row[figure]} {figure}")
                if row["max_loads_per_key_between"] > 1:
                    failures.append(f"deploy {name}: a key loaded twice between invalidations")
    for failure in failures:
        print("FAILED:", failure)
    report = {"ideal_seconds": ideal, "budget": options.budget, "figures": summary, "deploy": deployed}
    print(json.dumps({**report, "deploy_without_version": deployed_without}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
