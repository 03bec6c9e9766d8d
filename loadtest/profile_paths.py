"""The two paths the figures watch, as workloads to profile: a warm hit in one thread,
and coroutines stampeding one cold key in one event loop.

    python loadtest/profile_paths.py hit              # own time by package (cProfile)
    python loadtest/profile_paths.py cold --coroutines 10000
    python loadtest/profile_paths.py hit --quick      # a few calls, for CI
    py-spy record -r 2000 -o hit.svg -- python loadtest/profile_paths.py hit --plain

With ``--plain`` the workload runs unprofiled, for a sampling profiler outside it
(py-spy's flame graph). Otherwise it runs under cProfile and prints the share of the
workload's own time spent in each package's functions (stampede, redis-py, asyncio, the
rest), then the functions with the most own time; the last line printed is the shares
as JSON. cProfile's overhead is per call, so the shares lean towards code making many
small calls: read them beside the timed parts of ``bench_hit_path.py``, not instead of
them.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
from collections import defaultdict
from typing import Any

from stampede import Stampede
from stampede.testing import server_url

VALUE = {"id": 42, "name": "category map", "children": [{"id": i, "name": f"c{i}"} for i in range(20)]}
PACKAGES = ("stampede", "redis", "asyncio", "orjson", "hiredis")


def warm_hits(url: str, options: argparse.Namespace) -> Any:
    """A workload of ``--calls`` warm hits, one after another."""
    layer = Stampede.from_url(url, namespace="profile-hit")

    @layer.cached_loader("item:{item_id}", ttl=3600)
    def load(item_id: int) -> dict[str, Any]:
        return VALUE

    load(42)

    def run() -> None:
        for _ in range(options.calls):
            load(42)

    return run, layer.close


def cold_stampedes(url: str, options: argparse.Namespace) -> Any:
    """A workload of ``--rounds`` rounds of ``--coroutines`` tasks on a new cold key."""
    layer = Stampede.from_url(url, namespace="profile-cold")

    @layer.cached_loader("cold:{key}", ttl=3600)
    async def load(key: int) -> dict[str, Any]:
        await asyncio.sleep(options.delay)
        return VALUE

    async def rounds() -> None:
        await load(-1)  # the loop's store and connections, made before the profiled rounds
        for key in range(options.rounds):
            await asyncio.gather(*(load(key) for _ in range(options.coroutines)))
        await layer.aclose()

    def run() -> None:
        asyncio.run(rounds())

    return run, layer.close


def package_of(filename: str) -> str:
    """The package a profiled function belongs to, by its file's path."""
    parts = filename.replace("\\", "/").split("/")
    for package in PACKAGES:
        if package in parts:
            return package
    return "other"


def report(profile: cProfile.Profile, top: int) -> dict[str, Any]:
    """Own time by package, a built-in's (a socket call, orjson) given to the package of
    the functions that called it; the event loop's wait for I/O or a timer (idle) apart."""
    stats = pstats.Stats(profile)
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]  # func -> (cc, nc, tt, ct, callers)
    own: dict[str, float] = defaultdict(float)
    rows = []
    for (filename, line, name), (_, calls, own_time, _, callers) in entries.items():
        rows.append((own_time, calls, f"{filename.rsplit('/', 1)[-1]}:{line}({name})"))
        if filename != "~":
            own[package_of(filename)] += own_time
        elif "poll" in name or "select" in name:
            own["idle"] += own_time
        elif "orjson" in name:
            own["orjson"] += own_time
        else:  # callers: caller -> (calls, primitive calls, own time from there, total)
            for caller, edge in callers.items():
                own[package_of(caller[0])] += edge[2]
    idle = own.pop("idle", 0.0)
    busy = sum(own.values()) or 1.0
    print(f"\nown time by package, built-ins counted with their callers ({idle / (busy + idle):.0%} idle apart)")
    for package, seconds in sorted(own.items(), key=lambda item: -item[1]):
        print(f"   {package:<10} {seconds / busy:>6.1%}")
    print(f"\nthe {top} functions with the most own time (share of the busy time)")
    for own_time, calls, where in sorted(rows, reverse=True)[:top]:
        print(f"   {own_time / busy:>6.1%} {calls:>8} calls  {where}")
    return {"shares": {package: round(seconds / busy, 4) for package, seconds in own.items()}, "idle_s": idle}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", choices=["hit", "cold"])
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--calls", type=int, default=20000, help="hit: warm hits")
    parser.add_argument("--coroutines", type=int, default=1000, help="cold: tasks per round")
    parser.add_argument("--rounds", type=int, default=10, help="cold: rounds, a new key each")
    parser.add_argument("--delay", type=float, default=0.05, help="cold: the loader's seconds")
    parser.add_argument("--plain", action="store_true", help="run unprofiled (for py-spy)")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="a few calls or one small round (CI)")
    options = parser.parse_args()
    if options.quick:
        options.calls, options.coroutines, options.rounds = 300, 100, 1
    with server_url(options.redis) as url:
        run, close = (warm_hits if options.path == "hit" else cold_stampedes)(url, options)
        try:
            if options.plain:
                run()
            else:
                profile = cProfile.Profile()
                profile.runcall(run)
                print(json.dumps(report(profile, options.top)))
        finally:
            close()


if __name__ == "__main__":
    main()
