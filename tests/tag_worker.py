"""A worker process for the tag tests: one cached loader tagged ``category:{category_id}``.

Prints "ready" once connected and waits for "go". Then calls the loader for category 1:
the loader reads the version on the server (the "database"), prints "loading", and waits
for "release" on stdin before it returns that version. The worker prints the value its
call got, calls again, and prints that value too: one JSON line with both.
--cluster: --url is a node of a Redis Cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import redis

from stampede import Stampede


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--cluster", action="store_true")
    options = parser.parse_args()
    database: Any = (
        redis.RedisCluster.from_url(options.url, socket_timeout=5)
        if options.cluster
        else redis.Redis.from_url(options.url, socket_timeout=5)
    )
    layer = Stampede.from_url(options.url, namespace="tags", cluster=options.cluster, lock_ttl=10, wait_timeout=30)

    @layer.cached_loader("product-list:{category_id}", tags=["category:{category_id}"])
    def product_list(category_id: int) -> dict[str, Any]:
        version = int(database.get("version") or 0)
        database.incr("loads")
        print("loading", flush=True)
        if sys.stdin.readline().strip() != "release":
            raise SystemExit(2)
        return {"category": category_id, "version": version}

    layer._runner.store.get("warm-up")  # type: ignore[union-attr]  # open a connection
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    first = product_list(1)
    second = product_list(1)
    print(json.dumps({"first": first, "second": second, "stats": layer.stats()}), flush=True)
    layer.close()


if __name__ == "__main__":
    main()
