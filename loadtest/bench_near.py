"""Figures for the near cache: the hit path, what an invalidation costs, and the lease.

    python loadtest/bench_near.py            # starts a throwaway server on 127.0.0.1
    python loadtest/bench_near.py --quick    # fewer rounds, for CI

1. Warm hits in one thread, in interleaved rounds (alternating which goes first): raw
   redis-py GET + orjson.loads of the value, stampede without the near cache, with it
   (a decode per hit: each caller its own object), and with ``near_cache="shared"``. The
   ratios against raw GET + loads, round by round, give the figure (their median). Also
   the lease lapses seen meanwhile: the tracker thread renewing under a busy caller.
2. ``invalidate()`` from a layer without a near cache while 1, 4 and 16 processes hold
   the key in theirs (each also calling it every ``--holder-interval``, 2 ms by default,
   so copies are there to drop):
   latency median, p99 and max, against the same invalidation with no holder at all.
   ``--cluster``: the same on a 3-primary Redis Cluster started by the script (2b).
3. The lease: a layer whose stream goes into a black hole (a FaultProxy stalls its
   connections) stops serving copies by itself; the time from the stall to the first
   call that no longer gets a copy, over several stalls.

The last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis

from stampede import Stampede
from stampede._core.near import NEAR_LEASE
from stampede.demo import run_workers
from stampede.testing import ClusterServers, FaultProxy, server_url

VALUE = {"id": 42, "name": "category map", "children": [{"id": i, "name": f"c{i}"} for i in range(20)]}


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def hit_path(url: str, options: argparse.Namespace) -> dict[str, Any]:
    client = redis.Redis.from_url(url, socket_timeout=5)
    client.set("bench:raw", orjson.dumps(VALUE))
    layers = {
        "stampede": Stampede.from_url(url, namespace="bench-far"),
        "near": Stampede.from_url(url, namespace="bench-near", near_cache=True),
        "near shared": Stampede.from_url(url, namespace="bench-shared", near_cache="shared"),
    }
    loaders: dict[str, Callable[[int], Any]] = {}
    for name, layer in layers.items():
        loaders[name] = layer.cached_loader("item:{item_id}", ttl=3600)(lambda item_id: VALUE)
    for name, load in loaders.items():
        deadline = time.monotonic() + 10
        while layers[name].stats()["near_hits" if name != "stampede" else "hits"] < 3:
            assert load(42) == VALUE and time.monotonic() < deadline, f"{name}: never warm"
            time.sleep(0.01)

    def raw() -> None:
        for _ in range(options.calls):
            orjson.loads(client.get("bench:raw"))  # type: ignore[arg-type]

    def cached(load: Callable[[int], Any], calls: int) -> Callable[[], None]:
        def run() -> None:
            for _ in range(calls):
                load(42)

        return run

    def rate(run: Callable[[], None], calls: int) -> float:
        start = time.perf_counter()
        run()
        return calls / (time.perf_counter() - start)

    # A near hit is ~30x cheaper than a GET: more calls per round keep rounds alike in length.
    runs = {"raw": (raw, options.calls), "stampede": (cached(loaders["stampede"], options.calls), options.calls)}
    for name in ("near", "near shared"):
        runs[name] = (cached(loaders[name], options.calls * 30), options.calls * 30)
    rates: dict[str, list[float]] = {name: [] for name in runs}
    ratios: dict[str, list[float]] = {name: [] for name in runs if name != "raw"}
    lapses_before = {name: layers[name].stats()["near_lease_lapses"] for name in ("near", "near shared")}
    started = time.monotonic()
    for round_number in range(options.hit_rounds):
        order = list(runs) if round_number % 2 == 0 else list(reversed(runs))
        this_round = {name: rate(*runs[name]) for name in order}
        for name, value in this_round.items():
            rates[name].append(value)
            if name != "raw":
                ratios[name].append(value / this_round["raw"])
    elapsed = time.monotonic() - started
    lapses = sum(layers[name].stats()["near_lease_lapses"] - lapses_before[name] for name in lapses_before)
    for layer in layers.values():
        layer.close()
    client.close()

    print(f"\n1. Warm hit path, one thread, {options.hit_rounds} interleaved rounds")
    print(f"   {'':<26}{'calls/s':>12}{'x raw GET+loads':>18}   (median; min..max of the round ratios)")
    print(f"   {'raw GET + orjson.loads':<26}{statistics.median(rates['raw']):>12.0f}{1.0:>18.2f}")
    figures: dict[str, Any] = {}
    for name, label in (("stampede", "stampede, no near cache"), ("near", "near cache (own object)"),
                        ("near shared", 'near cache, "shared"')):  # fmt: skip
        ratio = statistics.median(ratios[name])
        spread = f"{min(ratios[name]):.2f}..{max(ratios[name]):.2f}"
        print(f"   {label:<26}{statistics.median(rates[name]):>12.0f}{ratio:>18.2f}   ({spread})")
        figures[name] = {"calls_per_s": round(statistics.median(rates[name])), "ratio": round(ratio, 2)}
    print(f"   lease lapses while the caller thread was busy: {lapses} in {elapsed:.1f} s, two layers")
    figures["lease_lapses"] = lapses
    return figures


def holder(url: str, interval: float, cluster: bool) -> None:
    """A process holding one key in its near cache, calling it every ``interval`` s;
    prints "ready" once a copy is served, and its stats when a line arrives on stdin."""
    layer = Stampede.from_url(url, namespace="bench-inv", near_cache=True, ttl=3600, cluster=cluster)
    load = layer.cached_loader("item:{item_id}")(lambda item_id: VALUE)
    deadline = time.monotonic() + 30
    while layer.stats()["near_hits"] == 0 and time.monotonic() < deadline:
        load(1)
        time.sleep(0.005)
    stop = threading.Event()

    def call() -> None:
        while not stop.wait(interval):
            load(1)

    thread = threading.Thread(target=call)
    thread.start()
    print("ready", flush=True)
    sys.stdin.readline()
    stop.set()
    thread.join(10)
    print(json.dumps(layer.stats()), flush=True)
    layer.close()


def invalidation_latency(url: str, options: argparse.Namespace, cluster: bool = False) -> dict[str, Any]:
    writer = Stampede.from_url(url, namespace="bench-inv", cluster=cluster)
    invalidate = writer.cached_loader("item:{item_id}")(lambda item_id: VALUE).invalidate
    figures: dict[str, Any] = {}

    def measure() -> list[float]:
        samples = []
        for _ in range(options.invalidations):
            time.sleep(0.005)  # let the holders copy the value again
            started = time.perf_counter()
            invalidate(1)
            samples.append((time.perf_counter() - started) * 1000)
        return samples

    where = "on a 3-primary cluster, " if cluster else ""
    print(f"\n2{'b' if cluster else ''}. invalidate() latency {where}{options.invalidations} invalidations each, "
          "holders calling every "
          f"{options.holder_interval * 1000:g} ms, ms")  # fmt: skip
    print(f"   {'holders':<10}{'median':>8}{'p99':>8}{'max':>8}   copies dropped")
    baseline = measure()
    rows = [("none", baseline, 0)]
    command = [sys.executable, __file__, "--holder", url, "--holder-interval", str(options.holder_interval)]
    command += ["--cluster"] if cluster else []
    for processes in options.holders:
        measured: list[list[float]] = []
        results = run_workers(command, processes, on_ready=lambda: measured.append(measure()))  # noqa: B023
        rows.append((str(processes), measured[0], sum(r["near_invalidations"] for r in results)))
    for name, samples, dropped in rows:
        median, p99 = statistics.median(samples), percentile(samples, 0.99)
        print(f"   {name:<10}{median:>8.2f}{p99:>8.2f}{max(samples):>8.2f}   {dropped}")
        figures[name] = {"median_ms": round(median, 2), "p99_ms": round(p99, 2), "max_ms": round(max(samples), 2)}
    writer.close()
    return figures


def lease_lapse(url: str, options: argparse.Namespace) -> dict[str, Any]:
    port = redis.Redis.from_url(url).connection_pool.connection_kwargs["port"]
    samples = []
    with FaultProxy(port) as proxy:
        layer = Stampede.from_url(proxy.url, namespace="bench-lease", near_cache=True, socket_timeout=0.5)
        load = layer.cached_loader("item:{item_id}")(lambda item_id: VALUE)
        near = layer._near
        assert near is not None
        for _ in range(options.stalls):
            deadline = time.monotonic() + 10
            hits = layer.stats()["near_hits"]
            while layer.stats()["near_hits"] < hits + 3:  # serving copies again
                load(1)
                assert time.monotonic() < deadline, "the near cache never served again"
                time.sleep(0.005)
            proxy.stall()
            stalled = time.monotonic()
            while near.lease_until > time.monotonic():  # what a hit checks first
                time.sleep(0.0002)
            samples.append((time.monotonic() - stalled) * 1000)
            proxy.flow()
        layer.close()
    print(f"\n3. Lease: a stream stalled in a black hole, {options.stalls} times (lease {NEAR_LEASE * 1000:.0f} ms)")
    print(f"   stall to the last copy served, ms: median {statistics.median(samples):.1f}, "
          f"max {max(samples):.1f}")  # fmt: skip
    return {"median_ms": round(statistics.median(samples), 1), "max_ms": round(max(samples), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--hit-rounds", type=int, default=11)
    parser.add_argument("--invalidations", type=int, default=300)
    parser.add_argument("--holders", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--stalls", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (CI)")
    parser.add_argument("--holder-interval", type=float, default=0.002, help="seconds between a holder's calls")
    parser.add_argument("--cluster", action="store_true", help="section 2 on a 3-primary cluster too")
    parser.add_argument("--holder", help=argparse.SUPPRESS)  # a holder process's Redis URL
    options = parser.parse_args()
    if options.holder:
        holder(options.holder, options.holder_interval, options.cluster)
        return
    if options.quick:
        options.calls, options.hit_rounds, options.invalidations = 500, 3, 50
        options.holders, options.stalls = [1, 4], 5
    with server_url(options.redis) as url:
        figures = {
            "hit_path": hit_path(url, options),
            "invalidate": invalidation_latency(url, options),
            "lease": lease_lapse(url, options),
        }
    if options.cluster:
        with ClusterServers(3) as cluster:
            figures["invalidate_cluster"] = invalidation_latency(cluster.url, options, cluster=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
