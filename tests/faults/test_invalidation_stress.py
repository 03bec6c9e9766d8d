"""Invalidations racing loads under load and faults, across processes: no caller whose
call began after an invalidation completed is served a version older than the one that
invalidation was made for.

Three worker processes (``stress_worker.py``) of 6 threads call a cached loader over 30
keys, each through a FaultProxy of its own (four in tag mode, where the keys form five
groups, each a tag, and the writer invalidates a group by its tag). This process is the writer: it bumps a key's
version in the "database", invalidates the key (directly, not through a proxy), and
notes when the invalidation completed. Meanwhile it cuts a worker's connections, slows
its network past the socket timeout, stalls it, or pauses the whole worker (SIGSTOP) for
up to 0.9 s, past its 0.6 s leases. Extra loads are counted apart within a fault's span
(and its aftermath), and within those of the failures a worker saw on its own (a busy
machine misses the socket timeout too). It stops by itself.

    STAMPEDE_STRESS_SECONDS=120 python -m pytest tests/faults/test_invalidation_stress.py -s -o timeout=300

CI runs the short form (6 s). ``-s`` prints the figures.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis

from stampede import BackendUnavailable, Stampede
from stampede.testing import FaultProxy, History, Recorder

from ..promises.test_processes import Workers
from ..scenarios import NETWORK_FAULTS, disturb

SECONDS = float(os.environ.get("STAMPEDE_STRESS_SECONDS", "6"))
WORKER = str(Path(__file__).parent.parent.joinpath("stress_worker.py"))
PROCESSES, THREADS, KEYS = 3, 6, 30
GROUPS = 5  # tag mode: key k is tagged group:<k % 5>
CALL_BOUND = 5.0  # seconds: a pause lasts at most 0.9 s, wait_timeout is 10
TTL = 1.0  # the workers' (stress_worker.py), jitter 0.1
AFTERMATH = 1_000_000_000  # ns after a fault in which it may still cost a load: a lease, a cooldown


@pytest.mark.parametrize(("near", "tags"), [(False, False), (True, False), (True, True)],
                         ids=["", "near-cache", "tags-near-cache"])  # fmt: skip
def test_no_stale_value_after_an_invalidation_across_processes_under_faults(
    redis_url: str, redis_client: redis.Redis, figures: Callable[..., None], near: bool, tags: bool, tmp_path: Path
) -> None:
    """With ``near``, every worker serves from its near cache too: its stream is cut,
    slowed and stalled with the rest of its network, and a paused worker is paused far
    past its lease, while the writer's invalidations wait for the others. With ``tags``,
    four workers, and the writer invalidates a group of keys by its tag."""
    port = redis_client.connection_pool.connection_kwargs["port"]
    processes_ = PROCESSES + 1 if tags else PROCESSES
    writer_history = Recorder("writer")
    faulted: list[tuple[int, int]] = []  # when each fault lasted, and its aftermath
    counts: dict[str, Any] = {"faults": 0, "pauses": 0, "invalidations": 0, "refused": 0}
    workers = Workers()
    stop = threading.Event()
    with ExitStack() as stack:
        proxies = [stack.enter_context(FaultProxy(port)) for _ in range(processes_)]
        writer = Stampede.from_url(redis_url, namespace="stress", socket_timeout=2)
        stack.callback(writer.close)
        stack.callback(workers.stop_all)
        invalidate = writer.cached_loader("item:{key}")(lambda key: None).invalidate
        if tags:
            invalidate = functools.partial(writer.invalidate_tag, "group:{group}")  # type: ignore[assignment]
        processes = [
            workers.start(
                proxy.url,
                "--db-url",
                redis_url,
                "--threads",
                str(THREADS),
                "--keys",
                str(KEYS),
                "--seed",
                str(index),
                "--history",
                str(tmp_path / f"worker{index}.json"),
                *(["--near"] if near else []),
                *(["--groups", str(GROUPS)] if tags else []),
                script=WORKER,
            )
            for index, proxy in enumerate(proxies)
        ]
        for process in processes:
            workers.expect(process, "ready")
        workers.go(processes)

        def write() -> None:
            rng = random.Random(5)
            while not stop.wait(rng.uniform(0.005, 0.03)):
                key = rng.randrange(GROUPS if tags else KEYS)
                keys = [each for each in range(KEYS) if each % GROUPS == key] if tags else [key]
                with writer_history.op("write", *keys) as op:
                    version = int(redis_client.incr(f"db:group:{key}" if tags else f"db:{key}"))
                    for each in keys:
                        op.saw(version, key=each)
                try:
                    with writer_history.op("invalidate", *keys, version=dict.fromkeys(keys, version)):
                        invalidate(group=key) if tags else invalidate(key)
                except BackendUnavailable:
                    counts["refused"] += 1  # not completed: it promises nothing (recorded as raised)
                    continue
                counts["invalidations"] += 1

        def chaos() -> None:
            rng = random.Random(11)
            while not stop.wait(rng.uniform(0.05, 0.3)):
                victim = rng.randrange(processes_)
                proxy, process = proxies[victim], processes[victim]
                fault = rng.choice([*NETWORK_FAULTS, "pause"])
                counts["faults"] += 1
                began = time.monotonic_ns()
                if fault == "pause":
                    counts["pauses"] += 1
                    process.send_signal(signal.SIGSTOP)
                    stop.wait(rng.uniform(0.2, 0.9))
                    process.send_signal(signal.SIGCONT)
                else:
                    disturb(proxy, fault, 0.3, rng, stop)  # 0.3 s: past the workers' socket timeout
                faulted.append((began, time.monotonic_ns() + AFTERMATH))

        threads = [threading.Thread(target=write), threading.Thread(target=chaos)]
        for thread in threads:
            thread.start()
        time.sleep(SECONDS)  # the run's length: workers, writer and chaos run meanwhile
        stop.set()
        for thread in threads:
            thread.join(10)
        for proxy, process in zip(proxies, processes, strict=True):
            process.send_signal(signal.SIGCONT)
            proxy.flow()
            proxy.delay = 0.0
        results = [workers.result(process, timeout=60) for process in processes]
    # A worker that found the server failing on its own (a busy machine misses the 0.2 s
    # socket timeout too) served without the cache: a fault as much as the chaos's.
    seen = [moment for result in results for moment in result["failures_seen"]]
    faulted.extend((moment, moment + AFTERMATH) for moment in seen)

    history = History.load(*(tmp_path / f"worker{index}.json" for index in range(processes_)))
    history.extend(writer_history)
    # A fault may cost extra loads (a paused holder's lease lapses, an unreachable server
    # is read around): counted apart within its span. Every other promise holds throughout.
    report = history.check(ttl=TTL * 0.9, wait_bound=CALL_BOUND, weakened=faulted)
    calls = report.reads
    counts.update(
        calls=calls,
        violations=report.counts(),
        extra_loads_in_faults=len(report.weakened),
        hung=sum(result["hung"] for result in results),
        loads=sum(result["loads"] for result in results),
        slowest=round(report.slowest_call, 3),
        wait_timeouts=sum(result["stats"]["wait_timeouts"] for result in results),
        near_hits=sum(result["stats"]["near_hits"] for result in results),
        near_lease_lapses=sum(result["stats"]["near_lease_lapses"] for result in results),
        stale_writes_prevented=sum(result["stats"]["stale_writes_prevented"] for result in results),
    )
    print(f"\ninvalidation stress {SECONDS:g} s: {counts}")
    figures(
        f"invalidations racing loads, {processes_} processes x {THREADS} threads, {KEYS} keys, "
        f"cuts/latency/stalls/SIGSTOP, {SECONDS:g} s{', near cache' if near else ''}"
        f"{f', by tag over {GROUPS} groups' if tags else ''}",
        worst=counts["slowest"],
        deadline=CALL_BOUND,
        loads=counts["loads"],
        bound=f"< calls/2 ({calls} calls)",
        exceptions=f"none; violations {report.counts()} after {counts['invalidations']} invalidations "
        f"(stampede.testing.History: {report.operations} operations)",
    )
    assert report.ok, str(report)
    assert counts["hung"] == 0, counts
    assert counts["wait_timeouts"] == 0, counts
    assert calls > 1000 and counts["invalidations"] > 50 and counts["faults"] > 3, counts
    assert counts["loads"] < calls / 2, counts  # the cache still collapsed the load
    if near:
        assert counts["near_hits"] > calls / 10, counts  # copies were served between the faults
        assert counts["near_lease_lapses"] > 0, counts  # and leases ran out under them
    leftover = [key for key in redis_client.scan_iter("stress:*:lock") if redis_client.pttl(key) > 600]
    assert leftover == []
