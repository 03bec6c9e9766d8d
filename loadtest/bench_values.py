"""Figures for values and the write and read controls (``compress_above``, ``set``, ``peek``).

    python loadtest/bench_values.py            # starts the server it needs on 127.0.0.1
    python loadtest/bench_values.py --quick    # fewer rounds, for CI

1. Compression: for a 200-entry category map and a 1 MB value, the bytes stored and
   the warm hit's calls/s (one thread, read from the server: no near cache) with zlib
   and with zstd (if the ``zstd`` extra is installed) against no compression, in
   interleaved rounds (the median of the per-round ratios).
3. ``refresh()`` answered ``NOT_MODIFIED`` against written again: refreshes/s, and the
   near copies a reader elsewhere loses to it (a new expiry is a write that CLIENT
   TRACKING reports: the copy goes, and the reader's next call reads the server once).
2. ``loader.set`` and ``loader.peek`` calls/s against a raw redis-py SET and GET of the
   same bytes (and a GET that decodes them with orjson, as a peek does), interleaved
   the same way.

The last line is JSON with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis

from stampede import NOT_MODIFIED, Stampede, previous
from stampede._core.codec import Codec
from stampede._core.compression import ZSTD
from stampede.testing import server_url

CATEGORY_MAP = {
    str(n): {"id": n, "name": f"Category {n}", "parent": n // 10, "slug": f"category-{n}", "visible": n % 7 != 0}
    for n in range(200)
}
WORDS = "stampede cache lease token holder waiter takeover namespace sentinel value".split()
ONE_MB = {"rows": [{"id": n, "text": " ".join(WORDS[(n + k) % len(WORDS)] for k in range(12))} for n in range(9000)]}


def rate(call: Callable[[], Any], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return calls / (time.perf_counter() - started)


def interleaved(calls: dict[str, Callable[[], Any]], baseline: str, count: int, rounds: int) -> dict[str, Any]:
    """Calls/s of each of ``calls``, in ``rounds`` rounds whose order turns, and each one's
    ratio to ``baseline`` (the median of the per-round ratios)."""
    rates: dict[str, list[float]] = {name: [] for name in calls}
    ratios: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for round_number in range(rounds):
        order = names[round_number % len(names) :] + names[: round_number % len(names)]
        measured = {name: rate(calls[name], count) for name in order}
        for name in names:
            rates[name].append(measured[name])
            ratios[name].append(measured[name] / measured[baseline])
    return {
        name: {"calls/s": statistics.median(rates[name]), "ratio": statistics.median(ratios[name])} for name in names
    }


def compression(url: str, options: argparse.Namespace) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    kinds = ["none", "zlib"] + (["zstd"] if ZSTD is not None else [])
    results: dict[str, Any] = {}
    for label, value, count in (("200-entry map", CATEGORY_MAP, options.calls), ("1 MB value", ONE_MB, options.big)):
        loaders, stored = {}, {}
        layers = []
        for kind in kinds:
            settings: dict[str, Any] = {} if kind == "none" else {"compress_above": 1024, "compression": kind}
            layer = Stampede.from_url(url, namespace=f"values-{kind}", max_value_bytes=8 << 20, **settings)
            layers.append(layer)
            loader = layer.cached_loader("value:{name}", ttl=3600)(lambda name, value=value: value)
            loader(label)  # the one load
            loaders[kind] = lambda loader=loader, label=label: loader(label)
            stored[kind] = len(client.get(loader.key(label)) or b"")
        figures = interleaved(loaders, "none", count, options.rounds)
        for kind in kinds:
            figures[kind]["stored bytes"] = stored[kind]
            figures[kind]["size ratio"] = stored[kind] / stored["none"]
        results[label] = figures
        for layer in layers:
            layer.close()
    return results


def controls(url: str, options: argparse.Namespace) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    with Stampede.from_url(url, namespace="controls", jitter=0) as layer:
        loader = layer.cached_loader("value:{name}", ttl=3600)(lambda name: CATEGORY_MAP)
        loader("warm")
        raw = client.get(loader.key("warm"))
        assert raw is not None
        payload = bytes(raw)

        tagged = layer.cached_loader("tagged:{name}", ttl=3600, tags=["values"])(lambda name: CATEGORY_MAP)
        codec = Codec()

        def raw_set() -> None:
            client.set("raw", payload, px=3_600_000)

        def raw_set_encoded() -> None:  # what a set cannot do with less: encode the envelope, one SET
            client.set("raw", codec.encode(CATEGORY_MAP, time.time(), 0.0, key="raw"), px=3_600_000)

        figures = interleaved(
            {
                "raw SET": raw_set,
                "raw SET + encode": raw_set_encoded,
                "loader.set": lambda: loader.set(CATEGORY_MAP, "warm"),
                "tagged set": lambda: tagged.set(CATEGORY_MAP, "warm"),
                "raw GET": lambda: client.get("raw"),
                "raw GET + loads": lambda: orjson.loads(client.get("raw")[16:]),  # type: ignore[index]
                "loader.peek": lambda: loader.peek("warm"),
            },
            "raw SET",
            options.calls,
            options.rounds,
        )
        for name in ("raw GET + loads", "loader.peek"):  # against the raw GET, as their calls/s are
            figures[name]["ratio"] = figures[name]["calls/s"] / figures["raw GET"]["calls/s"]
        figures["raw GET"]["ratio"] = 1.0
        encoded = figures["raw SET + encode"]["calls/s"]
        for name in ("loader.set", "tagged set"):
            figures[name]["to raw SET + encode"] = figures[name]["calls/s"] / encoded
        for name, call in (("loader.set", lambda: loader.set(CATEGORY_MAP, "warm")),
                           ("tagged set", lambda: tagged.set(CATEGORY_MAP, "warm"))):  # fmt: skip
            figures[name]["round trips"] = round_trips(client, call)
        stats = layer.stats()
        assert stats["loads"] == 1 and stats["sets"] > 0
    return figures


def round_trips(client: redis.Redis, call: Callable[[], Any], times: int = 100) -> float:
    """The scripts the server ran for one ``call`` (INFO commandstats' EVALSHA and EVAL,
    over ``times`` calls): every step of a set is a script, sent one after the other, so
    each is a round trip (the commands a script runs inside are counted apart)."""

    def scripts() -> int:
        stats = client.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("evalsha", "eval"))

    before = scripts()
    for _ in range(times):
        call()
    return (scripts() - before) / times


def not_modified(url: str, options: argparse.Namespace) -> dict[str, Any]:
    """``refresh()`` whose loader answers NOT_MODIFIED (the expiry is set again) against one
    that returns the value (written again), for the category map and the 1 MB value; and
    what either costs a reader elsewhere that keeps a near copy: the tracking message of the
    write (PEXPIRE is one) drops the copy, so its next call reads the server once."""
    results: dict[str, Any] = {}
    for label, value, count in (("200-entry map", CATEGORY_MAP, options.calls // 10), ("1 MB value", ONE_MB,
                                                                                     options.big)):  # fmt: skip
        with (
            Stampede.from_url(url, namespace="refresh") as writer,
            Stampede.from_url(url, namespace="refresh", near_cache=True) as reader,
        ):
            answers = {
                "rewrite": lambda value=value: value,
                "not modified": lambda value=value: NOT_MODIFIED if previous() else value,
            }
            rows: dict[str, Any] = {}
            for name, answer in answers.items():
                key = f"{label}:{name}"
                loader = writer.cached_loader("value:{name}", ttl=3600)(lambda name, answer=answer: answer())
                near = reader.cached_loader("value:{name}", ttl=3600)(lambda name, value=value: value)
                loader(key)
                rows[name] = {"refresh calls/s": rate(lambda loader=loader, key=key: loader.refresh(key), count)}
                dropped, refills = 0, 0
                for _ in range(20):
                    wait_until_near_hit(near, key, reader)
                    before = reader.stats()
                    loader.refresh(key)
                    wait_until_dropped(reader, before["near_invalidations"])
                    near(key)
                    after = reader.stats()
                    dropped += after["near_invalidations"] - before["near_invalidations"]
                    refills += after["hits"] - before["hits"]
                rows[name]["near copies dropped per refresh"] = dropped / 20
                rows[name]["reader reads per refresh"] = refills / 20
            rows["not modified"]["ratio"] = rows["not modified"]["refresh calls/s"] / rows["rewrite"]["refresh calls/s"]
            results[label] = rows
    return results


def wait_until_near_hit(near: Any, key: str, layer: Stampede) -> None:
    """Call ``near`` until the reader serves ``key`` from its near copy."""
    deadline = time.monotonic() + 5
    while True:
        hits = layer.stats()["near_hits"]
        near(key)
        if layer.stats()["near_hits"] > hits:
            return
        assert time.monotonic() < deadline, "no near hit"
        time.sleep(0.001)


def wait_until_dropped(layer: Stampede, dropped: int, timeout: float = 0.2) -> None:
    """Until the reader's near cache dropped a copy since ``dropped`` (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while layer.stats()["near_invalidations"] == dropped and time.monotonic() < deadline:
        time.sleep(0.001)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a Redis to use (default: start one on 127.0.0.1)")
    parser.add_argument("--calls", type=int, default=3000, help="calls per round")
    parser.add_argument("--big", type=int, default=30, help="calls per round of the 1 MB value")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    if options.quick:
        options.calls, options.big, options.rounds = 300, 5, 3
    if ZSTD is None:
        print("zstd is not installed (pip install -e '.[zstd]'): its rows are left out")
    with server_url(options.url) as url:
        squeezed = compression(url, options)
        controlled = controls(url, options)
        kept = not_modified(url, options)
    print("Compression (one thread, warm hits read from the server; ratios to no compression, median of rounds):")
    for label, figures in squeezed.items():
        for kind, row in figures.items():
            print(f"  {label:<14} {kind:<5} stored {row['stored bytes']:>9} bytes ({row['size ratio']:.3f}x), "
                  f"hit {row['calls/s']:>8.0f} calls/s ({row['ratio']:.3f}x)")  # fmt: skip
    print("set and peek (one thread; set against a raw SET of the same envelope, peek against a raw GET):")
    for name, row in controlled.items():
        more = ""
        if "round trips" in row:
            more = f", {row['to raw SET + encode']:.3f}x a raw SET + encode, {row['round trips']:g} round trips"
        print(f"  {name:<16} {row['calls/s']:>8.0f} calls/s ({row['ratio']:.3f}x){more}")
    print("refresh() answered NOT_MODIFIED (its expiry set again) against written again, and a near-cached reader:")
    for label, rows in kept.items():
        for name, row in rows.items():
            print(f"  {label:<14} {name:<13} {row['refresh calls/s']:>7.0f} refreshes/s, near copies dropped per "
                  f"refresh {row['near copies dropped per refresh']:.2f}, reader's server reads per refresh "
                  f"{row['reader reads per refresh']:.2f}")  # fmt: skip
    print(json.dumps({"compression": squeezed, "controls": controlled, "not modified": kept}))


if __name__ == "__main__":
    main()
