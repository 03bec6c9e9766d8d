"""Generated workloads over every backend family, each history checked against the
promises (``stampede.testing.History``): one line per profile.

    python loadtest/check_histories.py                      # 10^6 operations in all
    python loadtest/check_histories.py --quick              # a short form (CI)
    python loadtest/check_histories.py --operations 200000  # per profile

A profile is a backend (one Redis server, Redlock over three, a 3-primary Cluster, a
Sentinel set's master, PostgreSQL if installed), a way of calling (eight threads, or 32
tasks of one event loop) and settings (plain, the near cache, a stale window with a
load budget of two). Each runs reads of one and of many keys, updates, sets and expiries
over four keys that collide, with a database query of a millisecond, in rounds of
``--round`` operations (a layer and a namespace each), until its share of operations is
done. Every server is started here on 127.0.0.1 and stopped by its PID. The line says:
operations, violations (by rule), loads, most loads of one entry, slowest call; the last
line printed is every figure as JSON. The exit status is 1 if any violation was found.

    python loadtest/check_histories.py --faults             # 60 s a fault profile
    python loadtest/check_histories.py --faults --quick     # 4 s a profile (CI)

``--faults`` runs the workload under faults instead (``stampede.testing.nemesis``): one
Redis server paused by SIGSTOP and its network stalled, cut and slowed; a Sentinel set's
graceful failover, and its master frozen until a replica is promoted; a Cluster of three
primaries with a replica each, a slot migrated and a primary SIGKILLed; Redlock with one
of its three servers paused; ZooKeeper leases with the ZooKeeper server paused (if
ZooKeeper is installed); PostgreSQL's network stalled, cut and slowed. Violations
inside a fault's span (and a second after it) of the rules it may weaken (extra loads;
for a failover also stale values and slow calls) are counted apart; any other is a
violation. One line per profile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from stampede import ConfigError, Redlock, Stampede
from stampede.testing import (
    ClusterServers,
    FaultProxy,
    History,
    PostgresServer,
    Recorder,
    RedisServer,
    Report,
    Rows,
    SentinelServers,
    ZooKeeperServer,
    arun_workload,
    find_postgres,
    find_zookeeper,
    layer_subject,
    run_workload,
)
from stampede.testing.nemesis import (
    FailuresSeen,
    Fault,
    Nemesis,
    frozen_master,
    network,
    pause,
    primary_killed,
    sentinel_failover,
    slot_moved,
    worker_killed,
)
from stampede.testing.workers import Workers

SETTINGS = {
    "plain": {},
    "near cache": {"near_cache": True},
    "stale window": {"stale_while_revalidate": 60.0, "max_concurrent_loads": 2},  # refreshes and misses queue
}


def run_round(url: str, options: dict[str, Any], asynchronous: bool, operations: int, seed: int) -> Report:
    recorder = Recorder()
    rows = Rows(recorder, delay=0.001)
    layer = Stampede.from_url(url, namespace=f"h{uuid.uuid4().hex[:8]}", ttl=300, wait_timeout=5, **options)
    try:
        subject = layer_subject(layer, rows, asynchronous=asynchronous)
        if asynchronous:
            asyncio.run(arun_workload(subject, recorder, keys=4, tasks=32, operations=operations, seed=seed))
        else:
            run_workload(subject, recorder, keys=4, threads=8, operations=operations, seed=seed)
    finally:
        layer.close()
    failed = [r for r in recorder.records if r.outcome not in ("ok", "CancelledError")]
    assert not failed, failed[:3]  # no operation may raise: the servers are healthy
    stale_window = options.get("stale_while_revalidate", 0.0)
    return History.of(recorder).check(stale_window=stale_window, wait_bound=5.0)


FAULTY = {"socket_timeout": 0.5, "lock_ttl": 0.6, "wait_timeout": 10, "breaker_cooldown": 0.5}
"""A fault profile's layer: a server that does not answer in half a second has failed, a
lease lapses within a pause, and an open breaker probes again soon."""
KEYS = 4
NEAR, WINDOW = SETTINGS["near cache"], SETTINGS["stale window"]


@dataclass
class FaultProfile:
    """A backend, the layer's settings, and the faults. The workload runs in eight threads
    and in 16 tasks of an event loop at once (over keys of their own), or, with
    ``workers``, in three processes, one of which the nemesis kills."""

    name: str
    url: str
    options: dict[str, Any]
    faults: list[Fault] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    workers: str | None = None  # the database's URL: run by worker processes

    @property
    def described(self) -> str:
        setting = next((name for name, value in SETTINGS.items() if value == self.settings), "")
        return f"{self.name} ({'3 processes' if self.workers else 'threads+asyncio'}, {setting})"


def fault_profiles(stack: ExitStack) -> list[FaultProfile]:
    """Each fault profile, its servers started."""
    profiles: list[FaultProfile] = []
    one = stack.enter_context(RedisServer())
    proxy = stack.enter_context(FaultProxy(one.port))
    profiles.append(FaultProfile("redis: paused, network", proxy.url, {}, [pause(one), network(proxy)], NEAR))
    database = stack.enter_context(RedisServer())
    killing = FaultProfile("redis: a worker killed", one.url, {}, workers=database.url)
    profiles.append(killing)
    sentinels = stack.enter_context(SentinelServers(replicas=1))
    profiles.append(FaultProfile("sentinel: failover", sentinels.url, {}, [sentinel_failover(sentinels)], WINDOW))
    profiles.append(FaultProfile("sentinel: frozen master", sentinels.url, {}, [frozen_master(sentinels)]))
    cluster = stack.enter_context(ClusterServers(3, replicas=1))
    tags = [f"row:{key}" for key in range(KEYS)] + [f"arow:{key}" for key in ASYNC_KEYS]
    faults = [slot_moved(cluster, tags), primary_killed(cluster)]
    profiles.append(FaultProfile("cluster: slot moved, primary killed", cluster.url, {"cluster": True}, faults))
    two, three = stack.enter_context(RedisServer()), stack.enter_context(RedisServer())
    redlock = Redlock([one.url, two.url, three.url], socket_timeout=0.5)
    stack.callback(redlock.close)
    profiles.append(FaultProfile("redlock: a lock server paused", one.url, {"redlock": redlock}, [pause(three)], NEAR))
    if find_zookeeper() is not None:
        zookeeper = stack.enter_context(ZooKeeperServer())
        faults = [pause(zookeeper, name="zookeeper paused")]
        options = {"zookeeper": zookeeper.hosts}
        profiles.append(FaultProfile("zookeeper: its server paused", one.url, options, faults, WINDOW))
    if find_postgres() is not None:
        postgres = stack.enter_context(PostgresServer())
        through = stack.enter_context(FaultProxy(postgres.port))
        url = postgres.url.replace(f":{postgres.port}/", f":{through.port}/")
        profiles.append(FaultProfile("postgres: network", url, {}, [network(through, seconds=0.6)], WINDOW))
    return profiles


ASYNC_KEYS = range(100, 100 + KEYS)


def run_under_faults(profile: FaultProfile, seconds: float, seed: int) -> tuple[Report, Nemesis, int, dict[str, int]]:
    """A workload of ``seconds`` under the profile's faults: its report (violations inside
    the faults' spans counted apart), the nemesis, the operations that raised, and more
    figures (workers killed)."""
    if profile.workers is not None:
        return _run_workers(profile, seconds, seed)
    recorder = Recorder()
    rows = Rows(recorder, delay=0.001)
    options = {**FAULTY, **profile.options, **profile.settings}
    seen = FailuresSeen()  # failures the layer found that the nemesis did not strike (a busy machine)
    layer = Stampede.from_url(profile.url, namespace=f"f{uuid.uuid4().hex[:8]}", ttl=300, observers=[seen], **options)
    errors: list[BaseException] = []

    def tasks() -> None:
        subject = layer_subject(layer, rows, "arow:{key}", asynchronous=True, tag="arows")
        work = arun_workload(subject, recorder, keys=ASYNC_KEYS, tasks=16, operations=10**9, seconds=seconds, seed=seed)
        try:
            asyncio.run(work)
        except BaseException as error:
            errors.append(error)

    loop = threading.Thread(target=tasks, name="tasks")
    try:
        subject = layer_subject(layer, rows)
        with Nemesis(profile.faults, seed=seed) as nemesis:
            loop.start()
            run_workload(subject, recorder, keys=KEYS, threads=8, operations=10**9, seconds=seconds, seed=seed)
            loop.join()
    finally:
        layer.close()
    if nemesis.errors or errors:
        error = (nemesis.errors or errors)[0]
        raise RuntimeError(f"a fault or the event loop failed: {error!r}") from error
    raised = sum(1 for r in recorder.records if r.outcome not in ("ok", "CancelledError"))
    window = profile.settings.get("stale_while_revalidate", 0.0)
    report = History.of(recorder).check(
        stale_window=window, wait_bound=12.0, weakened=nemesis.spans + seen.spans, weakens=nemesis.weakens
    )
    return report, nemesis, raised, {"failures_seen": len(seen.moments)}


def _run_workers(profile: FaultProfile, seconds: float, seed: int) -> tuple[Report, Nemesis, int, dict[str, int]]:
    """The workload in three worker processes, one SIGKILLed now and then (and replaced):
    no promise weakens."""
    assert profile.workers is not None
    with tempfile.TemporaryDirectory() as directory:
        with Workers(profile.url, profile.workers, directory, seconds=seconds, options=FAULTY, seed=seed) as workers:
            with Nemesis([worker_killed(workers)], between=(0.3, 1.0), seed=seed) as nemesis:
                workers.wait()
        history = History.load(*workers.streams)
        mid_load = workers.killed_mid_load()
    if nemesis.errors:
        raise RuntimeError(f"a fault failed: {nemesis.errors[0]!r}") from nemesis.errors[0]
    raised = sum(1 for r in history.records if r.completed is not None and r.outcome != "ok")
    report = history.check(wait_bound=12.0, weakened=nemesis.spans, weakens=nemesis.weakens)
    return report, nemesis, raised, {"killed": len(workers.killed), "killed_mid_load": mid_load}


def main_faults(options: argparse.Namespace) -> None:
    seconds = 4.0 if options.quick else options.seconds
    figures: dict[str, Any] = {}
    with ExitStack() as stack:
        profiles = fault_profiles(stack)
        print(f"{len(profiles)} fault profiles, {seconds:g} s each, over {KEYS} keys (and {KEYS} more in asyncio)")
        for profile in profiles:
            report, nemesis, raised, more = run_under_faults(profile, seconds, seed=1)
            said = f"{more['killed']} killed, {more['killed_mid_load']} of them mid-load" if "killed" in more else ""
            said = said or f"{more['failures_seen']} failures seen besides"
            weakened = dict(Counter(violation.rule for violation in report.weakened))
            row = {
                "operations": report.operations, "raised": raised, "violations": report.counts(),
                "weakened": weakened, "faults": dict(nemesis.counts), "loads": report.loads,
                "most_loads_per_epoch": report.most_loads_per_epoch, "slowest_ms": round(report.slowest_call * 1000, 1),
                **more,
            }  # fmt: skip
            figures[profile.name] = row
            print(f"   {profile.described:<60} {row['operations']:>7} operations ({raised} raised)  violations "
                  f"{row['violations'] or 0}  in faults' spans {weakened or 0}  faults {row['faults']}"
                  f"{' (' + said + ')' if said else ''}  most loads per entry {row['most_loads_per_epoch']}  "
                  f"slowest {row['slowest_ms']:.0f} ms", flush=True)  # fmt: skip
            if not report.ok:
                print("      " + str(report).replace("\n", "\n      "))
    print(json.dumps(figures))
    if any(profile["violations"] for profile in figures.values()):
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--operations", type=int, default=0, help="per profile (default: 10^6 in all)")
    parser.add_argument("--round", type=int, default=2000, help="operations per layer")
    parser.add_argument("--quick", action="store_true", help="a short form (CI)")
    parser.add_argument("--faults", action="store_true", help="the fault profiles (nemeses) instead")
    parser.add_argument("--seconds", type=float, default=60.0, help="per fault profile")
    options = parser.parse_args()
    if options.faults:
        main_faults(options)
        return
    figures: dict[str, Any] = {}
    with ExitStack() as stack:
        backends: dict[str, tuple[str, dict[str, Any]]] = {}
        one = stack.enter_context(RedisServer())
        backends["redis"] = (one.url, {})
        if not options.quick:
            two, three = stack.enter_context(RedisServer()), stack.enter_context(RedisServer())
            redlock = Redlock([one.url, two.url, three.url], socket_timeout=2.0)
            stack.callback(redlock.close)
            backends["redlock"] = (one.url, {"redlock": redlock})
            backends["cluster"] = (stack.enter_context(ClusterServers(3)).url, {"cluster": True})
            backends["sentinel"] = (stack.enter_context(SentinelServers()).url, {})
            if find_postgres() is not None:
                backends["postgres"] = (stack.enter_context(PostgresServer()).url, {})
        profiles = [
            (backend, way, setting)
            for backend in backends
            for way in ("threads", "asyncio")
            for setting in SETTINGS
            if not (setting == "near cache" and backend in ("cluster", "postgres"))  # refused there
        ]
        share = options.operations or (2000 if options.quick else -(-1_000_000 // len(profiles)))
        print(f"{len(profiles)} profiles, {share} operations each, rounds of {options.round}")
        for backend, way, setting in profiles:
            url, fixed = backends[backend]
            started = time.monotonic()
            counts: Counter[str] = Counter()
            totals = {"operations": 0, "reads": 0, "loads": 0, "most_loads_per_epoch": 0, "slowest_ms": 0.0}
            shown: list[str] = []
            seed = 0
            while totals["operations"] < share:
                size = min(options.round, share - totals["operations"])
                try:
                    report = run_round(url, {**fixed, **SETTINGS[setting]}, way == "asyncio", size, seed)
                except ConfigError as error:
                    print(f"   {backend} {way} {setting}: refused ({error})")
                    break
                seed += 1
                totals["operations"] += size
                totals["reads"] += report.reads
                totals["loads"] += report.loads
                totals["most_loads_per_epoch"] = max(totals["most_loads_per_epoch"], report.most_loads_per_epoch)
                totals["slowest_ms"] = max(totals["slowest_ms"], round(report.slowest_call * 1000, 1))
                counts.update(report.counts())
                if not report.ok and len(shown) < 3:
                    shown.append(str(report))
            name = f"{backend} {way} {setting}"
            took = time.monotonic() - started
            print(f"   {name:<30} {totals['operations']:>8} operations  violations {dict(counts) or 0}  "
                  f"loads {totals['loads']:>6}  most per entry {totals['most_loads_per_epoch']}  "
                  f"slowest {totals['slowest_ms']:.1f} ms  ({took:.0f} s)", flush=True)  # fmt: skip
            for text in shown:
                print("      " + text.replace("\n", "\n      "))
            figures[name] = {**totals, "violations": dict(counts)}
    print(json.dumps(figures))
    if any(profile["violations"] for profile in figures.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
