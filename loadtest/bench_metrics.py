"""What observing costs: warm hits in one thread with no exporter (the layer's own counters,
``stats()``, which every layer keeps), with the Prometheus exporter, and with the
OpenTelemetry one (the SDK with an in-memory reader, as a pipeline would have it),
beside raw redis-py GET + orjson.loads of the same value, in interleaved rounds of the
same run (the order rotates each round, so drift favours none). The figure of each is
the median of its per-round ratios to raw, and to the counters-only layer.

Round trips on a shared 2-core machine vary by more than what an observer adds, so a
second figure measures that directly, with no I/O: what one report of a hit costs
(``Events.incr``) with counters only and with each exporter added, in microseconds and
as a share of the median warm hit measured above.

    python loadtest/bench_metrics.py            # starts a throwaway server on 127.0.0.1
    python loadtest/bench_metrics.py --quick    # fewer rounds, for CI

The last line is the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

import orjson
import redis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from stampede import Observer, Stampede
from stampede._drivers.observe import Events, RateLimitedLog
from stampede.otel import OpenTelemetryMetrics
from stampede.prometheus import PrometheusMetrics
from stampede.testing import server_url

VALUE = {"id": 42, "name": "category map", "children": [{"id": i, "name": f"c{i}"} for i in range(20)]}


def hit_loop(layer: Stampede, calls: int) -> Callable[[], None]:
    @layer.cached_loader("item:{item_id}", ttl=3600)
    def load(item_id: int) -> dict[str, Any]:
        return VALUE

    assert load(42) == VALUE  # now warm

    def run() -> None:
        for _ in range(calls):
            load(42)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 1000 calls (CI)")
    options = parser.parse_args()
    if options.quick:
        options.calls, options.rounds = 1000, 3
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    with server_url(options.redis) as url:
        client = redis.Redis.from_url(url, socket_timeout=5)
        client.set("bench:raw", orjson.dumps(VALUE))
        layers = {
            "counters only": Stampede.from_url(url, namespace="bench-stats"),
            "prometheus": Stampede.from_url(
                url, namespace="bench-prometheus", observers=[PrometheusMetrics(CollectorRegistry())]
            ),
            "opentelemetry": Stampede.from_url(url, namespace="bench-otel", observers=[OpenTelemetryMetrics(provider)]),
        }

        def raw() -> None:
            for _ in range(options.calls):
                orjson.loads(client.get("bench:raw"))  # type: ignore[arg-type]

        runs = {"raw GET + loads": raw, **{name: hit_loop(layer, options.calls) for name, layer in layers.items()}}
        names = list(runs)
        rates: dict[str, list[float]] = {name: [] for name in names}
        for round_number in range(options.rounds):
            order = names[round_number % len(names) :] + names[: round_number % len(names)]
            for name in order:
                start = time.perf_counter()
                runs[name]()
                rates[name].append(options.calls / (time.perf_counter() - start))
        for layer in layers.values():
            assert layer.stats()["loads"] == 1
            layer.close()
        client.close()
    provider.shutdown()

    def ratio(name: str, base: str) -> float:
        return statistics.median(a / b for a, b in zip(rates[name], rates[base], strict=True))

    print(f"Warm hit path, one thread, {options.rounds} interleaved rounds of {options.calls} calls")
    print(f"   {'':<18} {'calls/s':>9} {'vs raw':>8} {'vs counters only':>17}")
    figures: dict[str, Any] = {}
    for name in names:
        median = statistics.median(rates[name])
        to_raw = ratio(name, "raw GET + loads")
        to_counters = ratio(name, "counters only")
        figures[name] = {"calls_per_s": round(median), "vs_raw": round(to_raw, 3), "vs_counters": round(to_counters, 3)}
        print(f"   {name:<18} {median:>9.0f} {to_raw:>8.3f} {to_counters:>17.3f}")
    print("\nOne report of a hit (Events.incr), no I/O, best of 5 x 100,000")
    hit_us = 1e6 / statistics.median(rates["counters only"])
    exporters: dict[str, list[Observer]] = {
        "counters only": [],
        "prometheus": [PrometheusMetrics(CollectorRegistry())],
        "opentelemetry": [OpenTelemetryMetrics(MeterProvider(metric_readers=[InMemoryMetricReader()]))],
    }
    figures["report_us"] = {}
    for name, observers in exporters.items():
        events = Events("bench", RateLimitedLog(logging.getLogger("bench")))
        for observer in observers:
            events.add(observer)
        cost = min(timeit.repeat(lambda events=events: events.incr("hits"), number=100_000, repeat=5)) / 100_000 * 1e6
        figures["report_us"][name] = round(cost, 3)
        print(f"   {name:<18} {cost:>6.2f} us   {cost / hit_us * 100:>5.2f}% of a warm hit ({hit_us:.0f} us)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
