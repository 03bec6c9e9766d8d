"""A worker process for the tests of ``set``, ``refresh`` and ``Cached``: one cached loader,
``product(product_id)``, whose "database" is the ``version`` key on the server.

Prints "ready" once connected and waits for "go". Then makes its ``--call`` (``get``:
call the loader, ``refresh``: ``product.refresh``) of product 1, and ``--then`` calls
the loader again if asked. A load counts itself (``INCR loads``), reads the version,
prints "loading" and waits for "release" on stdin before it returns. Then one JSON line
with what each call got (a ``LoadTimeout`` as an error, with the seconds it came after)
and the layer's stats. A worker whose load outlived its call (``--load-timeout``) waits
for that load's write and prints {"written": ...} last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import redis

from stampede import Cached, LoadTimeout, Stampede


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--call", choices=["get", "refresh"], default="get")
    parser.add_argument("--then", action="store_true", help="call the loader once more after")
    parser.add_argument("--pass-through", action="store_true", help="the loader returns Cached(store=False)")
    parser.add_argument("--load-timeout", type=float, default=0.0)
    options = parser.parse_args()
    database = redis.Redis.from_url(options.url, socket_timeout=5)
    layer = Stampede.from_url(
        options.url, namespace="controls", lock_ttl=10, wait_timeout=30, load_timeout=options.load_timeout
    )

    @layer.cached_loader("product:{product_id}")
    def product(product_id: int) -> Any:
        database.incr("loads")
        version = int(database.get("version") or 0)
        print("loading", flush=True)
        if sys.stdin.readline().strip() != "release":
            raise SystemExit(2)
        value = {"product": product_id, "version": version}
        return Cached(value, store=False) if options.pass_through else value

    layer._runner.store.get("warm-up")  # type: ignore[union-attr]  # open a connection
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    started = time.monotonic()
    try:
        seen = {"first": product.refresh(1) if options.call == "refresh" else product(1)}
    except LoadTimeout:
        seen = {"first": {"error": "LoadTimeout", "after": time.monotonic() - started}}
    if options.then:
        seen["then"] = product(1)
    print(json.dumps({**seen, "stats": layer.stats()}), flush=True)
    if "error" in seen["first"] and layer.stats()["loads"]:  # a load outlived its call: it writes first
        deadline = time.monotonic() + 30
        while product.peek(1) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        print(json.dumps({"written": product.peek(1) is not None}), flush=True)
    layer.close()


if __name__ == "__main__":
    main()
