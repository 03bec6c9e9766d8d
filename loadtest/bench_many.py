"""Figures for loaders over many keys (``cached_loader_many``).

    python loadtest/bench_many.py            # starts every server it needs on 127.0.0.1
    python loadtest/bench_many.py --quick    # fewer rounds and calls, for CI
    python loadtest/bench_many.py --plot loadtest/figures/many.png   # and its picture
    python loadtest/bench_many.py --cold-only --rounds 5   # figure 1 alone, two ways

1. Cold overlapping pages: ``--processes`` x ``--threads`` callers, each asking one page
   of ``--page`` ids drawn from ``--ids`` cold ids (the pages overlap), the loader
   sleeping ``--delay`` per call. For each way of caching: how often the database was
   asked for each id (its own count, summed over the processes), loader calls, ids per
   loader call, the slowest caller minus one load, and the client's CPU per entry asked
   (the processes' CPU time over the round, which queues up on the cores: what the
   slowest caller waits for beyond its load). Side by side: stampede's
   many-key loader, a loop of its single-key loader, dogpile.cache's
   ``get_or_create_multi`` over its Redis backend (if installed), and no protection.
2. A warm page in one thread: calls/s of the many-key loader against a bare redis-py
   MGET + one ``orjson.loads`` per value of the same values, and against a loop of
   single-key cached calls, in interleaved rounds (the median of the per-round ratios);
   the commands one page sends (INFO commandstats).
3. The same two on a Redis Cluster of three primaries.
4. A page whose ids are half in flight in another process: the ids each loader call was
   asked for show that nobody reloaded them.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import redis
import redis.cluster
from plots import Panel, draw

from stampede import Stampede
from stampede.testing import ClusterServers, server_url

WAYS = ["stampede many", "stampede single loop", "dogpile multi", "no protection"]


def worker(options: argparse.Namespace) -> None:
    """One process: ``--threads`` threads, each asking its page at once (``--way``)."""
    cluster = options.cluster
    database: Counter[int] = Counter()
    queries: list[int] = []
    lock = threading.Lock()

    def query(ids: list[int]) -> dict[int, dict[str, int]]:
        with lock:
            database.update(ids)
            queries.append(len(ids))
        time.sleep(options.delay)
        return {id_: {"id": id_} for id_ in ids}

    get_page = page_getter(options.way, options.url, options.namespace, cluster, query)
    draw = random.Random(options.seed)
    pages = [draw.sample(range(options.ids), options.page) for _ in range(options.threads)]
    warm_up(options.threads, lambda number: get_page([options.ids + 1 + number]))  # connections open, scripts loaded
    database.clear()
    queries.clear()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    barrier = threading.Barrier(options.threads, action=lambda: cpu.append(time.process_time()))
    latencies: list[float] = []
    wrong = []
    cpu: list[float] = []

    def call(page: list[int]) -> None:
        barrier.wait(30)
        start = time.perf_counter()
        found = get_page(page)
        elapsed = time.perf_counter() - start
        with lock:
            latencies.append(elapsed)
            if [found[id_]["id"] for id_ in page] != page:
                wrong.append(page)

    threads = [threading.Thread(target=call, args=(page,)) for page in pages]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu_ms = (time.process_time() - cpu[0]) * 1000
    print(json.dumps({"asked": dict(database), "queries": queries, "latencies": latencies, "wrong": len(wrong),
                      "cpu_ms": cpu_ms, "entries": len(pages) * options.page}), flush=True)  # fmt: skip


def warm_up(threads: int, call: Callable[[int], Any]) -> None:
    """One call from each of ``threads`` threads at once, so that each finds a connection
    of its own open (and the scripts loaded) when the timed round begins: opening one
    costs the client more than a cold entry does."""
    barrier = threading.Barrier(threads)

    def one(number: int) -> None:
        barrier.wait(30)
        call(number)

    workers = [threading.Thread(target=one, args=(number,)) for number in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def page_getter(
    way: str, url: str, namespace: str, cluster: bool, query: Callable[[list[int]], dict[int, Any]]
) -> Callable[[list[int]], dict[int, Any]]:
    if way == "no protection":
        return query
    if way == "dogpile multi":
        return dogpile_getter(url, namespace, query)
    layer = Stampede.from_url(url, cluster=cluster, namespace=namespace)
    if way == "stampede many":
        return layer.cached_loader_many("product:{product_id}")(query)  # type: ignore[no-any-return]
    single = layer.cached_loader("product:{product_id}")(lambda product_id: query([product_id])[product_id])

    def loop(ids: list[int]) -> dict[int, Any]:
        return {id_: single(id_) for id_ in ids}

    return loop


def dogpile_getter(url: str, namespace: str, query: Callable[[list[int]], dict[int, Any]]) -> Any:
    from dogpile.cache import make_region

    region = make_region().configure(
        "dogpile.cache.redis",
        expiration_time=300,
        arguments={"url": url, "distributed_lock": True, "lock_timeout": 10, "thread_local_lock": False},
    )  # fmt: skip

    def get_page(ids: list[int]) -> dict[int, Any]:
        keys = [f"{namespace}:product:{id_}" for id_ in ids]
        by_key = dict(zip(keys, ids, strict=True))

        def create(*missing: str) -> list[Any]:
            found = query([by_key[key] for key in missing])
            return [found[by_key[key]] for key in missing]

        return dict(zip(ids, region.get_or_create_multi(keys, create), strict=True))

    return get_page


def cold_pages(url: str, cluster: bool, options: argparse.Namespace) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {way: [] for way in options.ways}
    for number in range(options.rounds):
        order = options.ways if number % 2 == 0 else list(reversed(options.ways))
        for way in order:
            namespace = f"many-{uuid.uuid4().hex[:8]}"
            command = [sys.executable, __file__, "--worker", "--url", url, "--way", way, "--namespace", namespace,
                       "--threads", str(options.threads), "--page", str(options.page), "--ids", str(options.ids),
                       "--delay", str(options.delay)]  # fmt: skip
            if cluster:
                command.append("--cluster")
            results = run_seeded(command, options.processes)
            asked: Counter[int] = Counter()
            for result in results:
                asked.update({int(id_): count for id_, count in result["asked"].items()})
            queries = [size for result in results for size in result["queries"]]
            latencies = [latency for result in results for latency in result["latencies"]]
            rows[way].append({
                "ids": len(asked), "max_per_id": max(asked.values()), "id_loads": sum(asked.values()),
                "loader_calls": len(queries), "ids_per_call": statistics.mean(queries),
                "over_load_ms": (max(latencies) - options.delay) * 1000, "wrong": sum(r["wrong"] for r in results),
                "cpu_us_per_entry": sum(r["cpu_ms"] for r in results) * 1000 / sum(r["entries"] for r in results),
            })  # fmt: skip
    where = "a 3-primary cluster" if cluster else "one server"
    print(f"\n{'3' if cluster else '1'}. Cold overlapping pages on {where}: {options.processes} processes x "
          f"{options.threads} threads, a page of {options.page} ids each from {options.ids} cold ids, loader "
          f"{options.delay * 1000:.0f} ms a call, {options.rounds} interleaved round(s), the worst shown")  # fmt: skip
    header = ("", "ids asked", "max per id", "id loads", "loader calls", "ids/call", "slowest - load ms",
              "CPU us/entry")  # fmt: skip
    print("   {:<22} {:>9} {:>10} {:>9} {:>12} {:>9} {:>18} {:>13}".format(*header))
    summary = {}
    for way, results in rows.items():
        worst = {
            "ids": max(r["ids"] for r in results), "max_per_id": max(r["max_per_id"] for r in results),
            "id_loads": max(r["id_loads"] for r in results), "loader_calls": max(r["loader_calls"] for r in results),
            "ids_per_call": min(r["ids_per_call"] for r in results),
            "over_load_ms": max(r["over_load_ms"] for r in results), "wrong": max(r["wrong"] for r in results),
            "cpu_us_per_entry": max(r["cpu_us_per_entry"] for r in results),
        }  # fmt: skip
        summary[way] = worst
        print("   {:<22} {:>9} {:>10} {:>9} {:>12} {:>9.1f} {:>18.1f} {:>13.1f}".format(
            way, worst["ids"], worst["max_per_id"], worst["id_loads"], worst["loader_calls"],
            worst["ids_per_call"], worst["over_load_ms"], worst["cpu_us_per_entry"]))  # fmt: skip
        assert worst["wrong"] == 0, f"{way}: a caller got a wrong value"
    assert summary["stampede many"]["max_per_id"] == 1, "the many-key loader loaded an id twice"
    return summary


def run_seeded(command: list[str], processes: int) -> list[dict[str, Any]]:
    """Start ``processes`` workers, each with a seed of its own (pages of its own), let
    them go at once, and return their results. Every process is gone on return."""
    started = [subprocess.Popen([*command, "--seed", str(seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True) for seed in range(processes)]  # fmt: skip
    try:
        for process in started:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        for process in started:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        return [json.loads(process.communicate(timeout=120)[0].splitlines()[-1]) for process in started]
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait(5)


def commands_run(clients: list[redis.Redis]) -> Counter[str]:
    counted: Counter[str] = Counter()
    for client in clients:
        for name, stat in client.info("commandstats").items():
            counted[name.removeprefix("cmdstat_")] += int(stat["calls"])
    return counted


def warm_page(url: str, cluster: bool, node_urls: list[str], options: argparse.Namespace) -> dict[str, Any]:
    layer = Stampede.from_url(url, cluster=cluster, namespace=f"warm-{uuid.uuid4().hex[:8]}", ttl=3600)
    client: Any = redis.cluster.RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    value = {"id": 0, "name": "a product", "price": 1999, "tags": ["a", "b"]}

    def query(ids: list[int]) -> dict[int, Any]:
        return {id_: {**value, "id": id_} for id_ in ids}

    many = layer.cached_loader_many("product:{product_id}")(query)
    one = layer.cached_loader("product:{product_id}")(lambda product_id: query([product_id])[product_id])
    page = list(range(options.page))
    many(page)
    bare_keys = [f"bare:{{{id_}}}" for id_ in page]
    for key, id_ in zip(bare_keys, page, strict=True):
        client.set(key, orjson.dumps({**value, "id": id_}))
    mget = client.mget_nonatomic if cluster else client.mget

    def bare() -> Any:
        return [orjson.loads(raw) for raw in mget(bare_keys)]

    def loop() -> Any:
        return {id_: one(id_) for id_ in page}

    ways: dict[str, Callable[[], Any]] = {"many": lambda: many(page), "bare MGET": bare, "single loop": loop}
    assert many(page) == loop() and list(many(page).values()) == bare()
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for number in range(options.warm_rounds):
        order = list(ways) if number % 2 == 0 else list(reversed(ways))
        for name in order:
            calls = options.warm_calls if name != "single loop" else max(1, options.warm_calls // 10)
            start = time.perf_counter()
            for _ in range(calls):
                ways[name]()
            rates[name].append(calls / (time.perf_counter() - start))
    nodes = [redis.Redis.from_url(node) for node in node_urls]
    before = commands_run(nodes)
    many(page)
    after = commands_run(nodes)
    after.subtract(before)
    after["info"] -= len(nodes)
    sent = +after
    versus_bare = statistics.median(m / b for m, b in zip(rates["many"], rates["bare MGET"], strict=True))
    versus_loop = statistics.median(m / s for m, s in zip(rates["many"], rates["single loop"], strict=True))
    where = "a 3-primary cluster" if cluster else "one server"
    print(f"\n{'3' if cluster else '2'}. A warm page of {options.page} on {where}, one thread, "
          f"{options.warm_rounds} interleaved rounds")  # fmt: skip
    for name, measured in rates.items():
        print(f"   {name:<14} {statistics.median(measured):>10.0f} pages/s")
    print(f"   many / bare MGET + orjson: {versus_bare:.2f}x (goal >= 0.9x); many / single loop: {versus_loop:.1f}x "
          f"(goal >= 20x); commands per page: {dict(sent)}")  # fmt: skip
    for node in nodes:
        node.close()
    client.close()
    layer.close()
    rates_now = {name: statistics.median(measured) for name, measured in rates.items()}
    return {"versus_bare": versus_bare, "versus_loop": versus_loop, "commands": dict(sent), "rates": rates_now}


def half_in_flight(url: str, options: argparse.Namespace) -> dict[str, Any]:
    """Process A loads ids 0..49 slowly; once it is loading, process B asks 25..74."""
    namespace = f"flight-{uuid.uuid4().hex[:8]}"
    base = [sys.executable, __file__, "--half-worker", "--url", url, "--namespace", namespace]
    first = subprocess.Popen([*base, "--start", "0", "--delay", "0.5"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    second = subprocess.Popen([*base, "--start", str(options.page // 2), "--delay", str(options.delay)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        for process in (first, second):
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        assert first.stdin is not None and second.stdin is not None and first.stdout is not None
        first.stdin.write("go\n")
        first.stdin.flush()
        assert first.stdout.readline().strip() == "loading"
        second.stdin.write("go\n")
        second.stdin.flush()
        results = [json.loads(process.communicate(timeout=60)[0].splitlines()[-1]) for process in (first, second)]
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.kill()
                process.wait(5)
    asked: Counter[int] = Counter()
    for result in results:
        for call in result["calls"]:
            asked.update(call)
    print(f"\n4. A page of {options.page} whose first half is in flight in another process")
    print(f"   process A's loader calls: {[len(call) for call in results[0]['calls']]} ids; process B's: "
          f"{[len(call) for call in results[1]['calls']]} ids (B asked for {options.page}); "
          f"max loads of one id: {max(asked.values())}")  # fmt: skip
    assert max(asked.values()) == 1, "an id in flight was loaded again"
    return {"first": [len(call) for call in results[0]["calls"]], "second": [len(call) for call in results[1]["calls"]]}


def half_worker(options: argparse.Namespace) -> None:
    calls: list[list[int]] = []
    layer = Stampede.from_url(options.url, namespace=options.namespace)

    @layer.cached_loader_many("product:{product_id}")
    def products(product_ids: list[int]) -> dict[int, Any]:
        calls.append(list(product_ids))
        print("loading", flush=True)
        time.sleep(options.delay)
        return {id_: {"id": id_} for id_ in product_ids}

    layer.store().get("warm-up")
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    page = list(range(options.start, options.start + options.page))
    assert products(page) == {id_: {"id": id_} for id_ in page}
    print(json.dumps({"calls": calls}), flush=True)
    layer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a server of your own (default: one started here)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--page", type=int, default=50)
    parser.add_argument("--ids", type=int, default=500)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm-rounds", type=int, default=5)
    parser.add_argument("--warm-calls", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="one round, fewer calls (CI)")
    parser.add_argument("--no-cluster", action="store_true", help="leave out figure 3")
    parser.add_argument("--cold-only", action="store_true", help="figure 1 alone (stampede many, no protection)")
    parser.add_argument("--plot", help="also draw figures 1 and 2 beside the peers' to this PNG")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--half-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--way", default="stampede many", help=argparse.SUPPRESS)
    parser.add_argument("--namespace", default="many", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker(options)
        return
    if options.half_worker:
        half_worker(options)
        return
    if options.quick:
        options.rounds, options.warm_rounds, options.warm_calls = 1, 3, 300
    options.ways = list(WAYS)
    try:
        import dogpile.cache  # noqa: F401
    except ImportError:
        print("dogpile.cache is not installed (pip install -e '.[loadtest]'): its row is left out")
        options.ways.remove("dogpile multi")
    figures: dict[str, Any] = {}
    if options.cold_only:
        options.ways = ["stampede many", "no protection"]
        with server_url(options.url) as url:
            figures["cold"] = cold_pages(url, False, options)
        print(json.dumps(figures))
        return
    with server_url(options.url) as url:
        figures["cold"] = cold_pages(url, False, options)
        figures["warm"] = warm_page(url, False, [url], options)
        figures["half_in_flight"] = half_in_flight(url, options)
    if not options.no_cluster:
        with ClusterServers(3) as cluster:
            options.ways = ["stampede many", "stampede single loop"]
            figures["cluster_cold"] = cold_pages(cluster.url, True, options)
            figures["cluster_warm"] = warm_page(cluster.url, True, [node.url for node in cluster.primaries], options)
    print(json.dumps(figures))
    if options.plot:
        plot(figures, options, options.plot)
        print(f"plot: {options.plot}")


def plot(figures: dict[str, Any], options: argparse.Namespace, path: str) -> None:
    """One PNG of figures 1 and 2 on one server: each way's loads of the cold ids (with
    its loads of one id at most) and its slowest caller past the load, and a warm page's
    rate beside a bare MGET's and the single-key loop's, measured in the same run."""
    cold = figures["cold"]
    ways = list(cold)
    loads = Panel(ways, f"database loads of the {options.ids} cold ids (fewer is better)",
                  [("", [cold[way]["id_loads"] for way in ways])],
                  notes=[f"{cold[way]['max_per_id']} at most per id" for way in ways])  # fmt: skip
    slowest = Panel(ways, "slowest caller, ms past one load (lower is better)",
                    [("", [cold[way]["over_load_ms"] for way in ways])], log=True,
                    notes=[f"{cold[way]['over_load_ms']:.0f}" for way in ways])  # fmt: skip
    warm = figures["warm"]["rates"]
    named = {"stampede many": warm["many"], "bare MGET + orjson": warm["bare MGET"],
             "stampede single loop": warm["single loop"]}  # fmt: skip
    rates = Panel(list(named), f"warm pages of {options.page} a second, one thread (higher is better)",
                  [("", list(named.values()))], notes=[f"{rate:,.0f}" for rate in named.values()])  # fmt: skip
    title = (f"Pages of {options.page} ids: {options.processes} processes x {options.threads} threads over "
             f"{options.ids} cold ids, loader {options.delay * 1000:.0f} ms a call; then warm")  # fmt: skip
    draw(path, title, [loads, slowest, rates])


if __name__ == "__main__":
    main()
