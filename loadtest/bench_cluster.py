"""Figures for scaling out: a cold-key stampede on a Redis Cluster beside one server, and
what a failover costs (a cluster primary killed, a Sentinel master failed over).

    python loadtest/bench_cluster.py            # starts every server it needs on 127.0.0.1
    python loadtest/bench_cluster.py --quick    # one round of each, for CI

1. ``--processes`` x ``--threads`` callers on one cold key, the loader sleeping
   ``--delay``, on one server and on a cluster of three primaries, in interleaved rounds:
   loads, the slowest caller minus the loader, and the commands the processes sent
   (MONITOR on every primary, scripts' inner commands excluded).
2. Failover under steady traffic: two layers (as two processes would) of ``--threads``
   threads each read ``--keys`` warm keys in a loop; the primary that owns them is
   SIGKILLed (cluster; its replica takes over), or the master is failed over or frozen
   by SIGSTOP until the sentinels promote its replica (Sentinel).
   Measured: the time from the fault to the first write the layer's client gets through
   (the new primary found), the loads per key and the callers that saw an error from the
   fault to ``--settle`` seconds after the promotion, for each ``on_backend_error``.
3. Through Sentinel, how long after the sentinels name a new master the waiting layer's
   subscription is on it.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import threading
import time
import uuid
from typing import Any

import redis

from stampede import BackendUnavailable, Stampede
from stampede._backends.redis.commands import TORN_DOWN
from stampede.demo import run_workers
from stampede.testing import ClusterServers, CommandMonitor, RedisServer, SentinelServers, names

NOT_CACHE_TRAFFIC = {"ECHO", "PING", "INFO", "CONFIG"}  # markers, warm-up, eviction check


def worker(options: argparse.Namespace) -> None:
    """One process of the stampede: ``--threads`` threads call one cold key at once."""
    layer = Stampede.from_url(options.url, cluster=options.cluster, namespace="bench")

    @layer.cached_loader("item:{key}")
    def load(key: str) -> dict[str, str]:
        time.sleep(options.delay)
        return {"key": key}

    layer.store().get("warm-up")  # open a connection
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    barrier = threading.Barrier(options.threads)
    latencies: list[float] = []
    lock = threading.Lock()

    def call() -> None:
        barrier.wait(30)
        start = time.perf_counter()
        assert load(options.key) == {"key": options.key}
        with lock:
            latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=call) for _ in range(options.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"latencies": latencies, "loads": layer.stats()["loads"]}), flush=True)
    layer.close()


def one_stampede(
    url: str, cluster: bool, monitors: list[CommandMonitor], options: argparse.Namespace
) -> dict[str, Any]:
    key = uuid.uuid4().hex[:12]
    command = [sys.executable, __file__, "--worker", "--url", url, "--key", key,
               "--threads", str(options.threads), "--delay", str(options.delay)]  # fmt: skip
    if cluster:
        command.append("--cluster")
    results = run_workers(command, options.processes, lambda: [monitor.checkpoint() for monitor in monitors])
    sent = [name for monitor in monitors for name in names(monitor.checkpoint()) if name not in NOT_CACHE_TRAFFIC]
    latencies = [latency for result in results for latency in result["latencies"]]
    return {"loads": sum(result["loads"] for result in results), "slowest": max(latencies), "commands": len(sent)}


def cold_key(options: argparse.Namespace) -> dict[str, Any]:
    rounds: dict[str, list[dict[str, Any]]] = {"one server": [], "cluster": []}
    with RedisServer() as single, ClusterServers(3) as cluster:
        single_monitors = [CommandMonitor(single.url)]
        cluster_monitors = [CommandMonitor(node.url) for node in cluster.primaries]
        for monitor in single_monitors + cluster_monitors:
            monitor.__enter__()
        try:
            for number in range(options.rounds):
                order = [("one server", single.url), ("cluster", cluster.url)]
                for name, url in order if number % 2 == 0 else reversed(order):
                    monitors = cluster_monitors if name == "cluster" else single_monitors
                    rounds[name].append(one_stampede(url, name == "cluster", monitors, options))
        finally:
            for monitor in single_monitors + cluster_monitors:
                monitor.__exit__(None, None, None)
    callers = options.processes * options.threads
    print(f"\n1. Cold key: {options.processes} processes x {options.threads} threads = {callers} callers, "
          f"loader {options.delay * 1000:.0f} ms, {options.rounds} interleaved round(s)")  # fmt: skip
    print("   {:<12} {:>6} {:>22} {:>22} {:>12}".format(
        "", "loads", "slowest - loader ms", "median round ms", "commands/process"))  # fmt: skip
    for name, results in rounds.items():
        over = [(result["slowest"] - options.delay) * 1000 for result in results]
        print("   {:<12} {:>6} {:>22.1f} {:>22.1f} {:>12.1f}".format(
            name,
            max(result["loads"] for result in results),
            max(over),
            statistics.median(over),
            max(result["commands"] for result in results) / options.processes,
        ))  # fmt: skip
        assert all(result["loads"] == 1 for result in results), f"{name}: more than one load"
    print("   (slowest: the worst round; commands: the worst round, over every primary, per process)")
    return {
        name: {"loads": max(r["loads"] for r in results), "over_loader_ms": max(r["slowest"] - options.delay
               for r in results) * 1000, "commands_per_process": max(r["commands"] for r in results)
               / options.processes}
        for name, results in rounds.items()
    }  # fmt: skip


class Traffic:
    """Two layers of threads reading warm keys in a loop, recording each call's outcome."""

    def __init__(self, layers: list[Stampede], keys: list[int], threads: int) -> None:
        self.loads: dict[int, int] = {}
        self.events: list[tuple[float, str]] = []  # (time, "hit" | "load" | "error")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._local = threading.local()
        loaders = [layer.cached_loader("item:{key}", ttl=3600)(self._load) for layer in layers]
        for load in loaders:
            for key in keys:
                load(key)  # warm
        self.loads.clear()
        self._threads = [
            threading.Thread(target=self._run, args=(load, keys, index)) for load in loaders for index in range(threads)
        ]

    def _load(self, key: int) -> dict[str, int]:
        self._local.loaded = True
        with self._lock:
            self.loads[key] = self.loads.get(key, 0) + 1
        time.sleep(0.005)
        return {"key": key}

    def _run(self, load: Any, keys: list[int], index: int) -> None:
        step = index
        while not self._stop.is_set():
            key = keys[step % len(keys)]
            step += 1
            self._local.loaded = False
            try:
                load(key)
                outcome = "load" if self._local.loaded else "served"
            except BackendUnavailable:
                outcome = "error"
            except Exception:  # anything else is a defect: counted, and reported below
                outcome = "crash"
            with self._lock:
                self.events.append((time.monotonic(), outcome))
            time.sleep(0.002)

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def figures(self, fault: float, recovered: float, keys: int) -> dict[str, Any]:
        """What the callers saw from the fault on."""
        after = [outcome for at, outcome in self.events if at >= fault]
        last_bad = max((at for at, outcome in self.events if at >= fault and outcome != "served"), default=fault)
        return {
            "recovery": recovered - fault,
            "normal": last_bad - fault,
            "loads_per_key": sum(self.loads.values()) / keys,
            "errors": after.count("error"),
            "crashes": after.count("crash"),
            "calls": len(after),
        }


def first_write(layer: Stampede, key: str, fault: float, timeout: float = 60.0) -> float:
    """When the layer's own client could write ``key`` again after ``fault`` (the new
    primary or master of its slot takes writes, and the client has found it): polled
    every 10 ms. The layer's threads share the client: when one of their commands fails,
    redis-py disconnects the node's connections, and a probe mid-command on one of them
    meets what the store calls ``TORN_DOWN`` (a ValueError from the pure-Python parser)."""
    client = layer.store().client  # type: ignore[attr-defined]
    deadline = fault + timeout
    while time.monotonic() < deadline:
        try:
            client.set(key, b"1", px=1000)
            return time.monotonic()
        except (redis.RedisError, OSError, *TORN_DOWN):  # redis-py re-routing the slot under this command
            time.sleep(0.01)
    raise RuntimeError("the store never took a write again")


def cluster_failover(policy: str, options: argparse.Namespace) -> dict[str, Any]:
    with ClusterServers(3, 1) as cluster:
        layers = [Stampede.from_url(cluster.url, cluster=True, namespace="bench", on_backend_error=policy)
                  for _ in range(2)]  # fmt: skip
        try:
            naming = layers[0].cached_loader("item:{key}")(lambda key: key)
            victim = cluster.owner(naming.key(0))
            keys = [key for key in range(2000) if cluster.owner(naming.key(key)) is victim][: options.keys]
            replica = cluster.replicas[cluster.primaries.index(victim)]
            with Traffic(layers, keys, options.threads) as traffic:
                time.sleep(0.5)
                fault = time.monotonic()
                victim.kill()
                recovered = first_write(layers[0], naming.key(keys[0]) + ":probe", fault)
                cluster.wait_promoted(replica)
                time.sleep(options.settle)
            return traffic.figures(fault, recovered, len(keys))
        finally:
            for layer in layers:
                layer.close()


def sentinel_failover(policy: str, options: argparse.Namespace, freeze: bool = False) -> dict[str, Any]:
    with SentinelServers() as sentinels:
        layers = [Stampede.from_url(sentinels.url, namespace="bench", on_backend_error=policy) for _ in range(2)]
        try:
            keys = list(range(options.keys))
            old = sentinels.current_master()
            with Traffic(layers, keys, options.threads) as traffic:
                time.sleep(0.5)
                fault = time.monotonic()
                old.pause() if freeze else sentinels.failover()
                sentinels.wait_master_moved(old)
                recovered = first_write(layers[0], "bench:{probe}", fault)
                time.sleep(options.settle)
            old.resume()
            return traffic.figures(fault, recovered, len(keys))
        finally:
            for layer in layers:
                layer.close()


def failovers(options: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    print(f"\n2. Failover under traffic: 2 layers x {options.threads} threads over {options.keys} warm keys")
    print("   {:<34} {:>12} {:>12} {:>14} {:>8} {:>8}".format(
        "", "recovery s", "normal s", "loads per key", "errors", "calls"))  # fmt: skip
    figures: dict[str, list[dict[str, Any]]] = {}
    runs = (
        ("cluster primary SIGKILLed", cluster_failover),
        ("SENTINEL FAILOVER", sentinel_failover),
        ("Sentinel master frozen (SIGSTOP)", functools.partial(sentinel_failover, freeze=True)),
    )
    for name, run in runs:
        for policy in ("load", "raise"):
            results = figures[f"{name}, {policy}"] = [run(policy, options) for _ in range(options.failover_rounds)]
            print("   {:<34} {:>12} {:>12} {:>14} {:>8} {:>8}".format(
                f"{name}, {policy}",
                "/".join(f"{result['recovery']:.2f}" for result in results),
                "/".join(f"{result['normal']:.2f}" for result in results),
                "/".join(f"{result['loads_per_key']:.1f}" for result in results),
                "/".join(str(result["errors"]) for result in results),
                "/".join(str(result["calls"]) for result in results),
            ))  # fmt: skip
    crashes = sum(run["crashes"] for runs in figures.values() for run in runs)
    assert crashes == 0, f"{crashes} calls raised something other than BackendUnavailable"
    print("   (recovery: from the fault to the first write the layer's own client got through; normal: to the")
    print("    last call that failed or loaded; loads per key, errors and calls: from the fault to the end of")
    print("    the run; one figure per run)")
    return figures


def subscriber_follows(options: argparse.Namespace) -> list[float]:
    """Seconds from the sentinels naming a new master (SENTINEL FAILOVER) to the waiting
    layer's subscription being on it (PUBSUB NUMSUB there), one per run."""
    follows = [one_follow() for _ in range(options.failover_rounds)]
    print("\n3. Sentinel: the waiting layer's subscriber on the new master, after SENTINEL FAILOVER")
    print("   " + "/".join(f"{follow:.2f}" for follow in follows) + " s after the sentinels named it (one per run)")
    return follows


def one_follow() -> float:
    with SentinelServers() as sentinels:
        holder, waiter = (Stampede.from_url(sentinels.url, namespace="bench", recheck_interval=30) for _ in "ab")
        started, release = threading.Event(), threading.Event()

        def slow(key: int) -> int:
            started.set()
            release.wait(30)
            return key

        loads = [layer.cached_loader("item:{key}")(slow) for layer in (holder, waiter)]
        channel = loads[0].key(1) + ":notify"
        calls = [threading.Thread(target=loads[0], args=(1,))]
        calls[0].start()
        started.wait(10)
        calls.append(threading.Thread(target=loads[1], args=(1,)))
        calls[1].start()
        try:
            old = sentinels.current_master()
            until_subscribed(old, channel)
            sentinels.failover()
            new = sentinels.wait_master_moved(old)
            named = time.monotonic()
            until_subscribed(new, channel)
            return time.monotonic() - named
        finally:
            release.set()
            for call in calls:
                call.join(30)
            holder.close()
            waiter.close()


def until_subscribed(server: RedisServer, channel: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with redis.Redis.from_url(server.url, socket_timeout=2) as client:
        while time.monotonic() < deadline:
            try:
                if int(client.pubsub_numsub(channel)[0][1]) >= 1:
                    return
            except redis.RedisError:
                pass
            time.sleep(0.005)
    raise RuntimeError(f"nobody subscribed to {channel} on port {server.port}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--settle", type=float, default=1.0, help="traffic kept up after the promotion, seconds")
    parser.add_argument("--failover-rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round of each (CI)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--key", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker(options)
        return
    if options.quick:
        options.rounds, options.failover_rounds, options.threads, options.settle = 1, 1, 4, 0.5
    figures = {"cold key": cold_key(options), "failover": failovers(options), "follow": subscriber_follows(options)}
    print(json.dumps({"figures": figures}))


if __name__ == "__main__":
    main()
