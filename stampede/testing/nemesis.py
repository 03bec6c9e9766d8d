"""Faults injected while a workload runs (Jepsen's nemeses), each remembered as a span of
``time.monotonic_ns()`` for ``History.check(weakened=...)``.

    with Nemesis([pause(server), network(proxy)], seed=1) as nemesis:
        run_workload(subject, recorder, seconds=20)
    report = History.of(recorder).check(weakened=nemesis.spans, weakens=nemesis.weakens)

A ``Fault`` applies itself and heals before it returns (or when the nemesis stops); the
nemesis runs one at a time, in a thread of its own, with a random pause between them.
Each fault names the rules it may weaken, as the documentation says (docs/failures.md):
a paused or unreachable server may cost an extra load (a lease lapses, a caller reads
around it); a failover may also undo an invalidation acknowledged within the
replication lag (a stale value), and a call may outlast its bound while the new primary
is found. A span runs from the fault's start to ``aftermath`` seconds after it healed: a
lease, a breaker's cooldown and a reconnection end within it.

Every process a fault stops or kills is one the caller started (a ``RedisServer``'s, by
its PID); every fault heals what it did before the nemesis returns.
"""

from __future__ import annotations

import functools
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from redis.crc import key_slot

from .faults import FaultProxy
from .servers import RedisServer
from .topologies import ClusterServers, SentinelServers, _command, _until
from .workers import Workers

LEASE_FAULTS = ("extra load",)
"""What a paused or unreachable server may cost: a second load of an entry."""
FAILOVER_FAULTS = ("extra load", "stale", "slow")
"""What a failover may cost besides: an invalidation acknowledged by the old primary
within the replication lag is lost, and calls wait while clients find the new one."""


@dataclass(frozen=True)
class Fault:
    """One kind of fault: ``run(stop, rng)`` applies it and heals it before it returns (at
    once if ``stop`` is set); it returns False if it found nothing to strike (not counted).
    ``once``: it can happen once in a run (a killed primary's replica is promoted; there
    is no second replica)."""

    name: str
    run: Callable[[threading.Event, random.Random], bool | None]
    weakens: tuple[str, ...] = LEASE_FAULTS
    once: bool = False
    settle: Callable[[], None] | None = None
    """Waits until what the fault disturbs is whole again (a failover's old master
    following the new one): a nemesis settles before its first fault, so that a run does
    not begin in the wake of the last one's."""


class Started(Protocol):
    """A server this process started: a ``RedisServer``, ``PostgresServer`` or
    ``ZooKeeperServer`` (its ``process``, None once stopped)."""

    process: subprocess.Popen[bytes] | None


def pause(server: Started, low: float = 0.2, high: float = 0.9, name: str = "server paused") -> Fault:
    """The server frozen by SIGSTOP for ``low`` to ``high`` seconds (past a lease, if
    ``high`` is), then SIGCONT."""

    def run(stop: threading.Event, rng: random.Random) -> None:
        process = server.process
        if process is None:
            return
        process.send_signal(signal.SIGSTOP)
        try:
            stop.wait(rng.uniform(low, high))
        finally:
            process.send_signal(signal.SIGCONT)

    return Fault(name, run)


def network(proxy: FaultProxy, seconds: float = 0.3, kinds: Sequence[str] = ("stall", "cut", "latency")) -> Fault:
    """The connections through ``proxy`` stalled, cut, or slowed past a socket timeout,
    for ``seconds``."""

    def run(stop: threading.Event, rng: random.Random) -> None:
        kind = rng.choice(list(kinds))
        try:
            if kind == "cut":
                proxy.cut()
            elif kind == "stall":
                proxy.stall()
            else:
                proxy.delay = seconds
            stop.wait(seconds)
        finally:
            proxy.flow()
            proxy.delay = 0.0

    return Fault("network", run)


def _settled_sentinels(sentinels: SentinelServers, timeout: float) -> Callable[[], None]:
    def settle() -> None:
        master = sentinels.current_master()
        _until(lambda: _command(master, "ROLE")[0] in (b"master", "master"), timeout, "the master to take writes")
        for server in sentinels.servers:
            if server is not master:
                _until(functools.partial(_following, server, master), timeout, "every replica to follow the master")
        sentinels.wait_watching(timeout)

    return settle


def _following(replica: RedisServer, master: RedisServer) -> bool:
    role = _command(replica, "ROLE")
    return role[0] in (b"slave", "slave") and int(role[2]) == master.port and role[3] in (b"connected", "connected")


def sentinel_failover(sentinels: SentinelServers, timeout: float = 30.0) -> Fault:
    """``SENTINEL FAILOVER``: a replica promoted while the master runs (graceful)."""

    def run(stop: threading.Event, rng: random.Random) -> None:
        old = sentinels.current_master()
        sentinels.failover()
        sentinels.wait_master_moved(old, timeout)
        sentinels.wait_watching(timeout)

    return Fault("failover", run, FAILOVER_FAULTS, settle=_settled_sentinels(sentinels, timeout))


def frozen_master(sentinels: SentinelServers, timeout: float = 30.0) -> Fault:
    """The master frozen by SIGSTOP until the sentinels promote a replica, then let go: it
    comes back as a replica of the new master."""

    def run(stop: threading.Event, rng: random.Random) -> None:
        old = sentinels.current_master()
        assert old.process is not None
        old.process.send_signal(signal.SIGSTOP)
        try:
            sentinels.wait_master_moved(old, timeout)
        finally:
            old.process.send_signal(signal.SIGCONT)
        _until(lambda: _command(old, "ROLE")[0] in (b"slave", "slave"), timeout, "the old master to follow")
        sentinels.wait_watching(timeout)

    return Fault("frozen master", run, FAILOVER_FAULTS, settle=_settled_sentinels(sentinels, timeout))


def primary_killed(cluster: ClusterServers, timeout: float = 30.0) -> Fault:
    """A cluster primary with a replica SIGKILLed: the replica is promoted (once a run)."""

    def run(stop: threading.Event, rng: random.Random) -> None:
        victims = [
            (primary, replica)
            for index, replica in enumerate(cluster.replicas)
            if (primary := cluster.primaries[index % len(cluster.primaries)]).process is not None
        ]
        if not victims:
            return
        primary, replica = rng.choice(victims)
        assert primary.process is not None
        primary.process.kill()
        primary.stop()  # reaped; no node asks it again
        cluster.wait_promoted(replica, timeout)

    return Fault("primary killed", run, FAILOVER_FAULTS, once=True, settle=cluster.wait_healthy)


def slot_moved(cluster: ClusterServers, hash_tags: Sequence[str]) -> Fault:
    """The slot of one of ``hash_tags`` (what keys hash by: ``row:3`` for the entry
    ``ns:{row:3}``) migrated, with its keys, to another primary."""

    def run(stop: threading.Event, rng: random.Random) -> None:
        slot = key_slot(rng.choice(list(hash_tags)).encode())
        owner = cluster.slot_owner(slot)
        targets = [node for node in cluster.nodes if node is not owner and node.process is not None]
        targets = [node for node in targets if cluster.is_primary(node)]
        if targets:
            cluster.move_slot(slot, rng.choice(targets))

    return Fault("slot moved", run, settle=cluster.wait_healthy)


def worker_killed(workers: Workers) -> Fault:
    """A worker process SIGKILLed mid-load (``Workers.kill`` holds its next load until
    the kill; ``Workers.killed_mid_load`` tells how many were), and another started in
    its place. It weakens no promise: the lease its load held lapses within
    ``lock_ttl``, one caller takes over and loads, and the killed load wrote nothing."""

    def run(stop: threading.Event, rng: random.Random) -> bool:
        return workers.kill(rng) is not None

    return Fault("worker killed", run, weakens=())


class Nemesis:
    """Runs ``faults``, one at a time and chosen at random, with ``between`` (low, high)
    seconds between them, from when it is entered until it is left. ``spans`` is when each
    lasted (plus ``aftermath``), ``weakens`` the rules any of them may weaken, ``counts``
    how many of each ran, and ``errors`` what a fault raised (the run should fail)."""

    def __init__(
        self,
        faults: Sequence[Fault],
        *,
        between: tuple[float, float] = (0.1, 0.5),
        aftermath: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.faults = list(faults)
        self.between = between
        self.aftermath_ns = int(aftermath * 1e9)
        self.spans: list[tuple[int, int]] = []
        self.counts: Counter[str] = Counter()
        self.errors: list[BaseException] = []
        self.weakens = tuple(sorted({rule for fault in self.faults for rule in fault.weakens}))
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def _run(self) -> None:
        faults = list(self.faults)
        while faults and not self._stop.wait(self._rng.uniform(*self.between)):
            fault = self._rng.choice(faults)
            if fault.once:
                faults.remove(fault)
            began = time.monotonic_ns()
            struck: bool | None = True
            try:
                struck = fault.run(self._stop, self._rng)
            except BaseException as error:  # kept: the caller's run should fail
                self.errors.append(error)
                return
            finally:
                if struck is not False:  # False: it found nothing to strike
                    self.spans.append((began, time.monotonic_ns() + self.aftermath_ns))
                    self.counts[fault.name] += 1

    def __enter__(self) -> Nemesis:
        for settle in dict.fromkeys(fault.settle for fault in self.faults if fault.settle is not None):
            settle()
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(60)

    def summary(self) -> dict[str, Any]:
        return {"faults": dict(self.counts), "errors": [repr(error) for error in self.errors]}


class FailuresSeen:
    """An observer (``layer.observe(seen)``, or ``Stampede(observers=[seen])`` in a worker
    process) that notes each moment its layer found a server failing: a command that
    failed (``redis_errors``) or a breaker that opened. A call that finds its server
    failing is served without the cache, as documented (docs/failures.md), so it may
    cost an extra load like any fault: ``spans`` are these moments, each with
    ``aftermath`` seconds after it, for ``History.check(weakened=...)`` beside a nemesis's.
    A fault the nemesis did not strike counts too: a machine too busy to answer within
    the socket timeout, a client reconnecting late after a pause."""

    EVENTS = ("redis_errors", "breaker_opened")

    def __init__(self, aftermath: float = 1.0) -> None:
        self.aftermath_ns = int(aftermath * 1e9)
        self.moments: list[int] = []  # appended from any thread: list.append is atomic

    def count(self, namespace: str, event: str, n: int) -> None:
        if event in self.EVENTS:
            self.moments.append(time.monotonic_ns())

    def began(self, namespace: str, measure: str) -> None:
        pass

    def ended(self, namespace: str, measure: str, outcome: str, seconds: float) -> None:
        pass

    @property
    def spans(self) -> list[tuple[int, int]]:
        return [(moment, moment + self.aftermath_ns) for moment in self.moments]


__all__ = [
    "FAILOVER_FAULTS",
    "LEASE_FAULTS",
    "FailuresSeen",
    "Fault",
    "Nemesis",
    "frozen_master",
    "network",
    "pause",
    "primary_killed",
    "sentinel_failover",
    "slot_moved",
    "worker_killed",
]
