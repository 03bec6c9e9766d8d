"""Figures for async loaders: a cold-key stampede of coroutines, and the warm async hit path.

    python loadtest/bench_async.py            # starts a throwaway server on 127.0.0.1
    python loadtest/bench_async.py --quick    # one round of each, for CI

1. ``--coroutines`` tasks in one event loop await one cold key, the loader sleeping
   ``--delay``: loader calls, the slowest caller, and the commands sent to Redis
   (MONITOR, scripts' inner commands excluded), with stampede and with no protection
   (GET, load on a miss, SET). Two floors from the same run: tasks that wait for one
   event set after the loader's time (asyncio alone), and tasks reading a warm key.
2. Warm hits awaited one after another: stampede's calls/s against raw redis.asyncio GET
   + orjson.loads of the same value, in interleaved rounds (alternating which goes first)
   in the same run; the median of the per-round ratios is the figure.

The last line printed is the figures as JSON (each round's slowest caller minus the
loader, loads per round, the hit ratio), for scripts and for the suite's short-form test.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import redis.asyncio

from stampede import Stampede
from stampede.testing import CommandMonitor, names, server_url

VALUE = {"id": 42, "name": "category map", "children": [{"id": i, "name": f"c{i}"} for i in range(20)]}


async def timed_gather(calls: list[Callable[[], Awaitable[Any]]]) -> list[float]:
    """Start every call at once; each caller's seconds from its call to its result."""

    async def one(call: Callable[[], Awaitable[Any]]) -> float:
        start = time.perf_counter()
        assert await call() == VALUE
        return time.perf_counter() - start

    return list(await asyncio.gather(*(one(call) for call in calls)))


async def asyncio_floor(options: argparse.Namespace) -> list[float]:
    """The same number of tasks waiting for one event set after the loader's time: what
    asyncio alone costs to start and wake them, with no cache and no Redis."""
    loaded = asyncio.Event()

    async def leader() -> dict[str, Any]:
        await asyncio.sleep(options.delay)
        loaded.set()
        return VALUE

    async def waiter() -> dict[str, Any]:
        await loaded.wait()
        return VALUE

    return await timed_gather([leader] + [waiter] * (options.coroutines - 1))


async def cold_key_stampede(url: str, options: argparse.Namespace) -> dict[str, Any]:
    keys = itertools.count()
    loads = {"stampede": 0, "off": 0}
    # Both sides get a blocking pool of 64 connections (stampede's default).
    plain = redis.asyncio.Redis(
        connection_pool=redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=64, socket_timeout=5)
    )
    layer = Stampede.from_url(url, namespace="bench-async")

    @layer.cached_loader("cold:{key}", ttl=3600)
    async def cached(key: int) -> dict[str, Any]:
        loads["stampede"] += 1
        await asyncio.sleep(options.delay)
        return VALUE

    async def unprotected(key: int) -> dict[str, Any]:
        raw = await plain.get(f"bench-async:off:{key}")
        if raw is not None:
            return orjson.loads(raw)  # type: ignore[no-any-return]
        loads["off"] += 1
        await asyncio.sleep(options.delay)
        await plain.set(f"bench-async:off:{key}", orjson.dumps(VALUE), ex=3600)
        return VALUE

    await cached(-1)  # connect, load the scripts
    await plain.get("warm-up")
    rows: dict[str, list[dict[str, Any]]] = {"stampede": [], "off": [], "asyncio floor": [], "warm floor": []}
    with CommandMonitor(url) as monitor:
        for _ in range(options.rounds):
            for name, loader in (("stampede", cached), ("off", unprotected)):
                key, before = next(keys), loads[name]
                monitor.checkpoint()
                latencies = await timed_gather([lambda: loader(key)] * options.coroutines)  # noqa: B023
                sent = names(monitor.checkpoint())
                rows[name].append({"loads": loads[name] - before, "latencies": latencies, "commands": len(sent)})
            latencies = await asyncio_floor(options)
            rows["asyncio floor"].append({"loads": 0, "latencies": latencies, "commands": 0})
            latencies = await timed_gather([lambda: cached(-1)] * options.coroutines)
            rows["warm floor"].append({"loads": 0, "latencies": latencies, "commands": 0})
    await layer.aclose()
    await plain.aclose(close_connection_pool=True)

    delay_ms = options.delay * 1000
    print(f"\n1. Cold key: {options.coroutines} coroutines in one event loop, loader {delay_ms:.0f} ms, "
          f"{options.rounds} round(s)")  # fmt: skip
    header = ("", "loader calls", "slowest ms", "median round", "over loader", "commands")
    print("   {:<12} {:>12} {:>11} {:>13} {:>12} {:>9}".format(*header))
    for name, results in rows.items():
        slowest = [max(r["latencies"]) * 1000 for r in results]
        loaded = name != "warm floor"  # the asyncio floor waits out the loader's time too
        print("   {:<12} {:>12} {:>11.1f} {:>13.1f} {:>+12.1f} {:>9}".format(
            name,
            max(r["loads"] for r in results),
            max(slowest),
            statistics.median(slowest),
            max(slowest) - (delay_ms if loaded else 0),
            max(r["commands"] for r in results) if name in ("stampede", "off") else "-",
        ))  # fmt: skip
    print("   (slowest: the longest any caller waited from its call to its value, worst round;")
    print("    commands: the worst round, MONITOR, scripts' inner commands excluded)")
    assert all(r["loads"] == 1 for r in rows["stampede"]), "stampede let more than one load through"
    return {
        name: {
            "loads": [r["loads"] for r in results],
            "over_loader_ms": [
                round(max(r["latencies"]) * 1000 - (delay_ms if name != "warm floor" else 0), 2) for r in results
            ],
        }
        for name, results in rows.items()
    }


async def warm_hits(url: str, options: argparse.Namespace) -> float:
    client = redis.asyncio.Redis.from_url(url, socket_timeout=5)
    await client.set("bench-async:raw", orjson.dumps(VALUE))
    layer = Stampede.from_url(url, namespace="bench-async")

    @layer.cached_loader("item:{item_id}", ttl=3600)
    async def load(item_id: int) -> dict[str, Any]:
        return VALUE

    assert await load(42) == VALUE  # now warm

    async def raw() -> None:
        for _ in range(options.calls):
            orjson.loads(await client.get("bench-async:raw"))

    async def cached() -> None:
        for _ in range(options.calls):
            await load(42)

    async def rate(run: Callable[[], Awaitable[None]]) -> float:
        start = time.perf_counter()
        await run()
        return options.calls / (time.perf_counter() - start)

    ratios, raw_rates, cached_rates = [], [], []
    for round_number in range(options.hit_rounds):
        if round_number % 2:  # alternate which goes first, so drift favours neither
            cached_rate, raw_rate = await rate(cached), await rate(raw)
        else:
            raw_rate, cached_rate = await rate(raw), await rate(cached)
        raw_rates.append(raw_rate)
        cached_rates.append(cached_rate)
        ratios.append(cached_rate / raw_rate)
    assert layer.stats()["loads"] == 1
    await layer.aclose()
    await client.aclose()
    print(f"\n2. Warm async hit path, one coroutine, {options.hit_rounds} interleaved rounds of {options.calls} calls")
    print(f"   raw redis.asyncio GET + orjson.loads  {statistics.median(raw_rates):>9.0f} calls/s (median)")
    print(f"   stampede async cached_loader          {statistics.median(cached_rates):>9.0f} calls/s (median)")
    spread = f"min {min(ratios):.3f}, max {max(ratios):.3f}"
    print(f"   ratio                                 {statistics.median(ratios):>9.3f} (median; {spread})")
    return statistics.median(ratios)


async def run(url: str, options: argparse.Namespace) -> None:
    cold = await cold_key_stampede(url, options)
    ratio = await warm_hits(url, options)
    print(json.dumps({"cold": cold, "hit_ratio": round(ratio, 4)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--coroutines", type=int, default=1000)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--hit-rounds", type=int, default=21)
    parser.add_argument("--quick", action="store_true", help="one round, fewer calls (CI)")
    options = parser.parse_args()
    if options.quick:
        options.rounds, options.calls, options.hit_rounds = 1, 1000, 3
    with server_url(options.redis) as url:
        asyncio.run(run(url, options))


if __name__ == "__main__":
    main()
