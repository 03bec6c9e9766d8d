"""Figures for named locks, each against redis-py's own Lock in the same run.

    python loadtest/bench_lock.py            # starts a throwaway server on 127.0.0.1
    python loadtest/bench_lock.py --quick    # fewer rounds, for CI

1. Round trips of one uncontended acquire + release, counted with MONITOR.
2. Uncontended acquire + release cycles per second, one thread, in interleaved rounds
   (alternating which goes first); the median of the per-round ratios is the figure.
   stampede's lock renews its lease while held (registered with the watchdog thread);
   redis-py's has no renewal.
3. Hand-off latency: a holder in one thread releases; a waiter in another (with its own
   client, as another process would be) has been blocked on the lock; the time from the
   release to the waiter holding it. stampede's waiter is woken by the release message;
   redis-py's Lock sleep-spins (``sleep=0.1``, the textbook 100 ms poll).
4. Redlock over 5 throwaway servers: uncontended acquisition latency, all five up and
   with two of them killed, blocking (one server after another) and asyncio (all at
   once), against one server's ``layer.lock`` in the same run.
5. The cost of Redlock leases behind a layer: the latency of a miss (read, lease, load,
   write, release) on a layer with Redlock leases over those servers, against the same
   layer without them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stampede import Redlock, Stampede
from stampede.testing import CommandMonitor, RedisServer, names, server_url


def print_latencies(rows: dict[str, list[float]]) -> None:
    """One line per row of milliseconds: median, p90 and max."""
    print("   {:<24} {:>9} {:>9} {:>9}".format("", "median ms", "p90 ms", "max ms"))
    for name, latencies in rows.items():
        ordered = sorted(latencies)
        p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
        print(f"   {name:<24} {statistics.median(ordered):>9.2f} {p90:>9.2f} {ordered[-1]:>9.2f}")


def round_trips(url: str, layer: Stampede, client: redis.Redis) -> None:
    ours = layer.lock("bench:trips")
    theirs = client.lock("bench:trips:redis-py")
    ours.acquire(), ours.release(), theirs.acquire(), theirs.release()  # scripts loaded
    with CommandMonitor(url) as monitor:
        ours.acquire()
        ours.release()
        stampede_sent = names(monitor.checkpoint())
        theirs.acquire()
        theirs.release()
        redis_py_sent = names(monitor.checkpoint())
    print("\n1. Round trips of one uncontended acquire + release (MONITOR)")
    print(f"   stampede  {len(stampede_sent)}  {' '.join(stampede_sent)}")
    print(f"   redis-py  {len(redis_py_sent)}  {' '.join(redis_py_sent)}")


def cycles_per_second(layer: Stampede, client: redis.Redis, options: argparse.Namespace) -> None:
    def ours() -> None:
        for _ in range(options.cycles):
            lock = layer.lock("bench:cycles")
            lock.acquire()
            lock.release()

    def theirs() -> None:
        for _ in range(options.cycles):
            lock = client.lock("bench:cycles:redis-py", timeout=10)
            lock.acquire()
            lock.release()

    def rate(run: Callable[[], None]) -> float:
        start = time.perf_counter()
        run()
        return options.cycles / (time.perf_counter() - start)

    ours_rates, theirs_rates, ratios = [], [], []
    for round_number in range(options.rounds):
        if round_number % 2:
            mine, other = rate(ours), rate(theirs)
        else:
            other, mine = rate(theirs), rate(ours)
        ours_rates.append(mine)
        theirs_rates.append(other)
        ratios.append(mine / other)
    print(f"\n2. Uncontended acquire + release, one thread, {options.rounds} interleaved rounds of {options.cycles}")
    print(f"   redis-py Lock    {statistics.median(theirs_rates):>8.0f} cycles/s (median)")
    print(f"   stampede lock    {statistics.median(ours_rates):>8.0f} cycles/s (median)")
    spread = f"min {min(ratios):.3f}, max {max(ratios):.3f}"
    print(f"   ratio            {statistics.median(ratios):>8.3f} (median; {spread})")


def hand_off(make_holder: Callable[[], Any], make_waiter: Callable[[], Any], hold: float, rounds: int) -> list[float]:
    """Milliseconds from each release to the waiter holding the lock."""

    def wait(waiting: threading.Event, got: list[float]) -> None:
        waiter = make_waiter()
        waiting.set()
        assert waiter.acquire()
        got.append(time.perf_counter())
        waiter.release()

    latencies = []
    for _ in range(rounds):
        holder = make_holder()
        assert holder.acquire()
        got: list[float] = []
        waiting = threading.Event()
        thread = threading.Thread(target=wait, args=(waiting, got))
        thread.start()
        waiting.wait(5)
        time.sleep(hold)  # the holder's work; the waiter is blocked meanwhile
        released = time.perf_counter()
        holder.release()
        thread.join(10)
        latencies.append((got[0] - released) * 1000)
    return latencies


def hand_offs(url: str, layer: Stampede, options: argparse.Namespace) -> None:
    waiter_layer = Stampede.from_url(url, namespace="bench")  # another process's subscriber
    waiter_client = redis.Redis.from_url(url)
    client = redis.Redis.from_url(url)
    results = {
        "stampede (message)": hand_off(
            lambda: layer.lock("bench:handoff", ttl=30),
            lambda: waiter_layer.lock("bench:handoff", ttl=30),
            options.hold,
            options.handoffs,
        ),
        "redis-py (100 ms spin)": hand_off(
            lambda: client.lock("bench:handoff:redis-py", timeout=30, sleep=0.1),
            lambda: waiter_client.lock("bench:handoff:redis-py", timeout=30, sleep=0.1),
            options.hold,
            options.handoffs,
        ),
    }
    waiter_layer.close()
    waiter_client.close()
    client.close()
    print(
        f"\n3. Hand-off latency, release to the waiter holding it, {options.handoffs} hand-offs "
        f"(holder keeps it {options.hold * 1000:.0f} ms)"
    )
    print_latencies(results)


def acquisition_ms(acquire_release: Callable[[], Any], count: int) -> list[float]:
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        lock = acquire_release()
        latencies.append((time.perf_counter() - started) * 1000)
        lock.release()
    return latencies


def miss_ms(layer: Stampede, count: int, prefix: str) -> list[float]:
    """Milliseconds of ``count`` misses in a row (distinct keys; the loader returns at
    once): read, lease, load, write and release."""
    load = layer.cached_loader(prefix + ":{key}", ttl=60)(lambda key: {"key": key})
    load(-1)  # warm connections and scripts
    latencies = []
    for key in range(count):
        started = time.perf_counter()
        load(key)
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


async def async_acquisition_ms(manager: Redlock, count: int) -> list[float]:
    lock = manager.lock("bench:redlock:async", ttl=10)
    assert await lock.aacquire()
    await lock.arelease()  # warm connections and scripts
    latencies = []
    for _ in range(count):
        lock = manager.lock("bench:redlock:async", ttl=10)
        started = time.perf_counter()
        assert await lock.aacquire()
        latencies.append((time.perf_counter() - started) * 1000)
        await lock.arelease()
    await manager.aclose()
    return latencies


def redlock_latency(url: str, layer: Stampede, options: argparse.Namespace) -> None:
    # A socket timeout of 1 s, not Redlock's 50 ms: the figures are of latency, and a
    # loaded machine (CI runs the quick form beside the suite) misses 50 ms now and then.
    servers = [RedisServer().start() for _ in range(5)]
    try:
        acquisitions: dict[str, list[float]] = {}
        misses: dict[str, list[float]] = {}
        with Redlock([server.url for server in servers], namespace="bench", socket_timeout=1.0) as manager, \
                Stampede.from_url(url, namespace="bench-redlock", redlock=manager) as leased:  # fmt: skip

            def redlock() -> Any:
                lock = manager.lock("bench:redlock", ttl=10)
                assert lock.acquire()
                return lock

            def single() -> Any:
                lock = layer.lock("bench:single")
                assert lock.acquire()
                return lock

            redlock().release(), single().release()  # warm connections and scripts
            acquisitions["layer.lock, 1 server"] = acquisition_ms(single, options.acquisitions)
            acquisitions["Redlock, 5 of 5 up"] = acquisition_ms(redlock, options.acquisitions)
            acquisitions["Redlock async, 5 of 5"] = asyncio.run(async_acquisition_ms(manager, options.acquisitions))
            misses["plain layer"] = miss_ms(layer, options.acquisitions, "bench:plain")
            misses["Redlock, 5 of 5 up"] = miss_ms(leased, options.acquisitions, "bench:five")
            servers[0].kill()
            servers[1].kill()
            acquisitions["Redlock, 3 of 5 up"] = acquisition_ms(redlock, options.acquisitions)
            acquisitions["Redlock async, 3 of 5"] = asyncio.run(async_acquisition_ms(manager, options.acquisitions))
            misses["Redlock, 3 of 5 up"] = miss_ms(leased, options.acquisitions, "bench:three")
    finally:
        for server in servers:
            server.stop()
    print(f"\n4. Uncontended acquisition latency, {options.acquisitions} acquisitions")
    print_latencies(acquisitions)
    print(f"\n5. A miss (read, lease, load, write), {options.acquisitions} distinct keys in a row,")
    print("   on a layer without and with Redlock leases over the same 5 servers")
    print_latencies(misses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--handoffs", type=int, default=30)
    parser.add_argument("--hold", type=float, default=0.05)
    parser.add_argument("--acquisitions", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (CI)")
    options = parser.parse_args()
    if options.quick:
        options.cycles, options.rounds, options.handoffs, options.acquisitions = 200, 3, 5, 20
    with server_url(options.redis) as url:
        client = redis.Redis.from_url(url, socket_timeout=5)
        with Stampede.from_url(url, namespace="bench") as layer:
            round_trips(url, layer, client)
            cycles_per_second(layer, client, options)
            hand_offs(url, layer, options)
            redlock_latency(url, layer, options)
        client.close()


if __name__ == "__main__":
    main()
