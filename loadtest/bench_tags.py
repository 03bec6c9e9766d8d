"""Figures for tags (``invalidate_tag``, ``expire_tag``: see ``stampede/_core/tags.py``).

    python loadtest/bench_tags.py            # starts the server it needs on 127.0.0.1
    python loadtest/bench_tags.py --quick    # fewer rounds and entries, for CI

1. Hits: calls/s of a cached loader with 0, 1 and 3 tags against the same loader without
   ``tags=`` and against a bare redis-py GET + ``orjson.loads``, one thread, interleaved
   rounds (the median of the per-round ratios): a tag costs a hit nothing.
2. ``invalidate_tag`` of a tag on 100, 1,000 and 10,000 live entries: seconds, and the
   same tag again once every entry has expired (its cost does not grow with entries that
   no longer exist).
3. Bookkeeping: the server's memory (INFO memory, used_memory) before and after
   ``--writes`` tagged writes of entries that live 1 s, and once they have expired:
   what is left is bounded by the live entries, not by every entry written.
4. The miss path: a tagged miss against an untagged one (the same round trips: the
   tag clock is read in the lease's script, the admission in the write's).
5. ``invalidate_tag`` of 100 to 10,000 entries on a PostgreSQL store (if its binaries
   are installed: ``pip install pgserver``), filled by a tagged many-key loader.

The last line is JSON with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import redis

from stampede import Stampede
from stampede.testing import PostgresServer, find_postgres, server_url

VALUE = {"id": 0, "name": "a product list", "items": list(range(20))}


def hits(url: str, options: argparse.Namespace) -> dict[str, Any]:
    layer = Stampede.from_url(url, namespace=f"hits-{uuid.uuid4().hex[:8]}", ttl=3600)
    client = redis.Redis.from_url(url)

    def make(tags: list[str] | None, name: str) -> Callable[[int], Any]:
        def product_list(category_id: int) -> dict[str, Any]:
            return {**VALUE, "id": category_id}

        product_list.__qualname__ = name
        return layer.cached_loader(f"{name}:{{category_id}}", tags=tags)(product_list)  # type: ignore[return-value]

    tagless = make(None, "tagless")
    ways: dict[str, Callable[[int], Any]] = {
        "tagless": tagless,
        "1 tag": make(["category:{category_id}"], "one"),
        "3 tags": make(["category:{category_id}", "catalog", "shop:s1"], "three"),
    }
    for load in ways.values():
        load(1)
    client.set("bare:{1}", orjson.dumps({**VALUE, "id": 1}))
    ways["bare GET"] = lambda _: orjson.loads(client.get("bare:{1}"))  # type: ignore[arg-type]
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for number in range(options.rounds):
        order = list(ways) if number % 2 == 0 else list(reversed(ways))
        for name in order:
            load = ways[name]
            start = time.perf_counter()
            for _ in range(options.calls):
                load(1)
            rates[name].append(options.calls / (time.perf_counter() - start))
    ratios = {
        name: statistics.median(m / t for m, t in zip(rates[name], rates["tagless"], strict=True)) for name in ways
    }
    print(f"1. Hits, one thread, {options.rounds} interleaved rounds of {options.calls} calls")
    for name, measured in rates.items():
        print(f"   {name:<9} {statistics.median(measured):>9.0f} calls/s   {ratios[name]:.3f}x tagless")
    layer.close()
    client.close()
    return {"calls_per_s": {name: statistics.median(r) for name, r in rates.items()}, "versus_tagless": ratios}


def invalidations(url: str, options: argparse.Namespace) -> dict[str, Any]:
    layer = Stampede.from_url(url, namespace=f"inv-{uuid.uuid4().hex[:8]}", ttl=3600, jitter=0)
    client = redis.Redis.from_url(url)
    found: dict[str, Any] = {}
    print("\n2. invalidate_tag of one tag")
    for size in options.sizes:

        @layer.cached_loader(f"product-{size}:{{product_id}}", tags=[f"category:{size}"])
        def product(product_id: int) -> dict[str, Any]:
            return {**VALUE, "id": product_id}

        @layer.cached_loader(f"short-{size}:{{product_id}}", tags=[f"expired:{size}"], ttl=1)
        def short(product_id: int) -> dict[str, Any]:
            return {**VALUE, "id": product_id}

        fill(product, size)
        start = time.perf_counter()
        count = layer.invalidate_tag(f"category:{size}")
        took = time.perf_counter() - start
        assert count == size, (count, size)
        fill(short, size)
        time.sleep(2.2)  # the values' 1 s and the members' margin of 1 s
        start = time.perf_counter()
        gone = layer.invalidate_tag(f"expired:{size}")
        after_expiry = time.perf_counter() - start
        assert gone == 0
        found[str(size)] = {"seconds": took, "after_expiry_seconds": after_expiry}
        print(f"   {size:>6} live entries: {took * 1000:8.1f} ms   {size} expired ones: {after_expiry * 1000:.1f} ms")
    layer.close()
    client.close()
    return found


def fill(product: Callable[[int], Any], size: int) -> None:
    """``size`` entries written by the loader (a miss each), in 8 threads."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(product, range(size)))


def memory(url: str, options: argparse.Namespace) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    namespace = f"mem-{uuid.uuid4().hex[:8]}"
    layer = Stampede.from_url(url, namespace=namespace, ttl=1, jitter=0)

    @layer.cached_loader("short:{n}", tags=["category:{n}", "catalog"])
    def short(n: int) -> int:
        return n

    def used() -> int:
        return int(client.info("memory")["used_memory"])

    before = used()
    start = time.perf_counter()
    batch = 1000
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        for first in range(0, options.writes, batch):
            list(pool.map(short, range(first, first + batch)))
    wrote = time.perf_counter() - start
    during = used()
    time.sleep(2.5)  # every value's 1 s, and the members' margin of 1 s
    keys_left = sum(1 for _ in client.scan_iter(match=f"{namespace}:*", count=1000))
    after = used()
    members = client.zcard(f"{namespace}:tag:{{catalog}}")
    print(f"\n3. Bookkeeping of {options.writes} tagged writes (2 tags each) of entries that live 1 s")
    print(f"   used_memory before {before / 1e6:.1f} MB, right after {during / 1e6:.1f} MB, "
          f"once expired {after / 1e6:.1f} MB; keys left {keys_left}, members of 'catalog' {members}")  # fmt: skip
    layer.close()
    client.close()
    return {
        "writes": options.writes,
        "write_seconds": wrote,
        "used_before": before,
        "used_after_writes": during,
        "used_after_expiry": after,
        "keys_left": keys_left,
        "catalog_members": members,
    }


def misses(url: str, options: argparse.Namespace) -> dict[str, Any]:
    layer = Stampede.from_url(url, namespace=f"miss-{uuid.uuid4().hex[:8]}", ttl=3600)

    @layer.cached_loader("plain:{n}")
    def plain(n: int) -> int:
        return n

    @layer.cached_loader("tagged:{n}", tags=["category:{n}", "catalog"])
    def tagged(n: int) -> int:
        return n

    rates: dict[str, list[float]] = {"untagged": [], "tagged": []}
    count = options.calls // 10
    for number in range(options.rounds):
        for name, load in (("untagged", plain), ("tagged", tagged))[:: 1 if number % 2 == 0 else -1]:
            start = time.perf_counter()
            for n in range(number * count, (number + 1) * count):
                load(n)
            rates[name].append(count / (time.perf_counter() - start))
    ratio = statistics.median(t / u for t, u in zip(rates["tagged"], rates["untagged"], strict=True))
    print("\n4. Misses, one thread (each a load and a write)")
    for name, measured in rates.items():
        print(f"   {name:<9} {statistics.median(measured):>9.0f} misses/s")
    print(f"   tagged / untagged: {ratio:.2f}x")
    layer.close()
    return {"misses_per_s": {name: statistics.median(r) for name, r in rates.items()}, "tagged_versus_untagged": ratio}


def on_postgres(options: argparse.Namespace) -> dict[str, Any]:
    """``invalidate_tag`` over a PostgreSQL store (skipped where it cannot be run)."""
    if find_postgres() is None:
        print("\n5. PostgreSQL: not run (no PostgreSQL binaries: pip install pgserver)")
        return {}
    found: dict[str, Any] = {}
    print("\n5. invalidate_tag of one tag on a PostgreSQL store (one transaction)")
    with PostgresServer() as server:
        layer = Stampede(postgres=server.url, namespace="bench", ttl=3600)
        for size in options.sizes:

            @layer.cached_loader_many(f"product-{size}:{{product_id}}", tags=[f"category:{size}"])
            def products(product_ids: list[int]) -> dict[int, Any]:
                return {id_: {**VALUE, "id": id_} for id_ in product_ids}

            for first in range(0, size, 500):
                products(list(range(first, min(size, first + 500))))
            start = time.perf_counter()
            count = layer.invalidate_tag(f"category:{size}")
            took = time.perf_counter() - start
            assert count == size, (count, size)
            found[str(size)] = {"seconds": took}
            print(f"   {size:>6} live entries: {took * 1000:8.1f} ms")
        layer.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a Redis server (default: start one)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1_000, 10_000])
    parser.add_argument("--writes", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and entries, for CI")
    options = parser.parse_args()
    if options.quick:
        options.rounds, options.calls, options.sizes, options.writes = 3, 2_000, [100, 1_000], 5_000
    with server_url(options.url) as url:
        figures = {
            "hits": hits(url, options),
            "invalidate_tag": invalidations(url, options),
            "memory": memory(url, options),
            "misses": misses(url, options),
        }
    figures["postgres_invalidate_tag"] = on_postgres(options)
    print(json.dumps({"figures": figures}))


if __name__ == "__main__":
    main()
