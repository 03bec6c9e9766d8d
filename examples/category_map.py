"""The classic: a shop's two-level category map, built by a database query, cached.

    python examples/category_map.py                              # embedded backend, threads
    python examples/category_map.py --redis redis://127.0.0.1:6379/0
    python examples/category_map.py --redis postgresql://app@127.0.0.1/app   # the PostgreSQL store

What one decorated function does on each call (``cached_loader``):

1. read the cache (one GET): a value or the null sentinel is returned at once;
2. on a miss, one caller per key in this process goes on, the others wait in memory;
3. that caller takes the key's lease in Redis (SET NX PX with a random token), or, if
   another process holds it, waits for its pub/sub message;
4. with the lease it reads the cache again (the lock script does, in the same round
   trip): someone may have written the value meanwhile;
5. only then does it run the query; it writes the value, or the null sentinel when the
   query found nothing, and releases the lease in one script, which also wakes every
   waiter, in this process and in every other.

This script shows it with threads against a SQLite "database" that logs every query:
a burst of threads on a cold shop costs one query; a shop that does not exist costs one
query, after which the null sentinel answers; an expired entry costs one query again.
It exits non-zero if any of that does not hold.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shop import CATEGORY_MAP_ENTRY, ShopDatabase

from stampede import CachedLoader, Stampede


def make_category_map(layer: Stampede, database: ShopDatabase, ttl: float) -> CachedLoader[[str], Any]:
    """The cached loader the examples and the load test share (the same keys everywhere)."""

    @layer.cached_loader(CATEGORY_MAP_ENTRY, ttl=ttl, null_ttl=ttl)
    def category_map(shop: str) -> dict[str, list[str]] | None:
        return database.category_map(shop)  # None (no such shop) is cached as the null sentinel

    return category_map


def burst(loader: Callable[[str], Any], shop: str, threads: int) -> list[Any]:
    """``threads`` threads call ``loader(shop)`` at the same moment; their results."""
    results: list[Any] = [None] * threads
    start = threading.Barrier(threads)

    def call(index: int) -> None:
        start.wait()
        results[index] = loader(shop)

    workers = [threading.Thread(target=call, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--redis", help="a Redis or postgresql:// URL; default: the embedded backend (this process only)"
    )
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--ttl", type=float, default=1.0, help="seconds a category map stays cached")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        database = ShopDatabase.create(Path(folder) / "shop.sqlite")
        url, namespace = options.redis, "example"
        layer = Stampede.from_url(url, namespace=namespace) if url else Stampede(namespace=namespace)
        print(f"cache: {options.redis or 'embedded'}; database: SQLite, {database.query_seconds * 1000:.0f} ms a query")
        category_map = make_category_map(layer, database, options.ttl)
        if options.redis:
            for shop in ("shop-1", "no-such-shop"):
                category_map.invalidate(shop)  # a fresh start on a server that outlives us
        ok = True

        def step(title: str, shop: str, expected_queries: int, expected: Any) -> None:
            nonlocal ok
            before = database.count()
            results = burst(category_map, shop, options.threads)
            queries = database.count() - before
            right = all(result == expected for result in results)
            print(f"{title:<46} {options.threads} threads: {queries} database quer{'y' if queries == 1 else 'ies'}, "
                  f"{'every caller got the right value' if right else 'WRONG VALUES'}")  # fmt: skip
            ok = ok and right and queries == expected_queries

        expected = database.category_map("shop-1")
        step("a cold shop", "shop-1", 1, expected)
        step("the same shop, cached", "shop-1", 0, expected)
        step("a shop that does not exist (-> None)", "no-such-shop", 1, None)
        step("again: the null sentinel answers", "no-such-shop", 0, None)
        time.sleep(options.ttl * 1.2)  # past the TTL and its jitter
        step(f"after the {options.ttl:g} s TTL expired", "shop-1", 1, expected)
        print("the map:", expected)
        print("cache counters:", layer.stats())
        layer.close()
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
