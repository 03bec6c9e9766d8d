"""Figures for the deploy that adopts ``version=`` (docs/deploys.md, ``_core.versions``):
what reaching the other side's entries costs each side.

    python loadtest/bench_versions.py            # starts the server it needs on 127.0.0.1
    python loadtest/bench_versions.py --quick    # fewer calls and rounds, for CI
    python loadtest/bench_versions.py --url redis://127.0.0.1:6379/0   # a server of your own

One server, one thread, interleaved rounds (the median of the per-round figures):

1. The unversioned side: ``set`` and ``invalidate`` of entries no versioned loader
   marked, against a raw SET and DEL of the same keys: the mark is read inside the
   script each sends anyway, so they cost what they cost before versions reached them.
2. The same two calls on entries a versioned loader marked: each is also the entry tag's
   invalidation, so every versioned entry goes too.
3. The versioned side's miss: a cold call of a versioned loader against one of the same
   loader without ``version=`` (the versioned one marks the unversioned entry first,
   one round trip, and writes its entry tag's membership).

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

import redis

from stampede import Stampede
from stampede.testing import server_url


def per_call(step: Callable[[int], Any], keys: range) -> float:
    """Microseconds per call of ``step`` over ``keys``."""
    started = time.perf_counter()
    for key in keys:
        step(key)
    return (time.perf_counter() - started) / len(keys) * 1e6


def product(key: int) -> dict[str, Any]:
    return {"id": key, "name": f"product {key}"}


def one_round(layer: Stampede, client: redis.Redis, calls: int, base: int) -> dict[str, float]:
    """Each figure of one round, on keys of its own (``base`` onwards)."""
    plain = layer.cached_loader("plain:{key}")(product)
    old = layer.cached_loader("product:{key}")(product)
    new = layer.cached_loader("product:{key}", version="2")(product)
    unmarked, marked, cold = range(base, base + calls), range(base + calls, base + 2 * calls), range(base, base + calls)
    figures: dict[str, float] = {}
    for key in unmarked:
        plain(key)
    figures["raw SET"] = per_call(lambda key: client.set(f"raw:{key}", b"x" * 40), unmarked)
    figures["unmarked set"] = per_call(lambda key: plain.set(product(key), key), unmarked)
    figures["raw DEL"] = per_call(lambda key: client.delete(f"raw:{key}"), unmarked)
    figures["unmarked invalidate"] = per_call(plain.invalidate, unmarked)
    figures["unversioned cold call"] = per_call(old, cold)
    figures["versioned cold call"] = per_call(new, cold)  # marks what the unversioned one wrote
    for key in marked:
        old(key), new(key)
    figures["marked set"] = per_call(lambda key: old.set(product(key), key), marked)
    for key in marked:
        new(key)
    figures["marked invalidate"] = per_call(old.invalidate, marked)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000, help="calls per figure and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds (CI)")
    parser.add_argument("--url", help="a server of your own (default: one started here)")
    options = parser.parse_args()
    calls, rounds = (200, 3) if options.quick else (options.calls, options.rounds)
    rows: dict[str, list[float]] = {}
    with server_url(options.url) as url:
        client = redis.Redis.from_url(url)
        with Stampede.from_url(url, namespace=f"versions-{uuid.uuid4().hex[:8]}") as layer:
            for number in range(rounds):
                for name, value in one_round(layer, client, calls, number * 10 * calls).items():
                    rows.setdefault(name, []).append(value)
        client.close()
    medians = {name: statistics.median(values) for name, values in rows.items()}
    pairs = [
        ("unmarked set", "raw SET"),
        ("unmarked invalidate", "raw DEL"),
        ("marked set", "unmarked set"),
        ("marked invalidate", "unmarked invalidate"),
        ("versioned cold call", "unversioned cold call"),
    ]
    ratios = {f"{name} / {baseline}": medians[name] / medians[baseline] for name, baseline in pairs}
    print(f"one server, one thread, {rounds} interleaved rounds of {calls} calls: us per call (median)")
    for name, value in medians.items():
        print(f"   {name:28} {value:9.1f}")
    for name, value in ratios.items():
        print(f"   {name:45} {value:5.2f}x")
    print(json.dumps({"us_per_call": medians, "ratios": ratios, "calls": calls, "rounds": rounds}))


if __name__ == "__main__":
    main()
