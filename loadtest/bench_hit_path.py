"""Where a warm hit's time goes: each part of stampede's blocking hit path timed on its
own, next to a bare redis-py GET + orjson.loads of the same value, in the same run.

    python loadtest/bench_hit_path.py            # starts a throwaway server on 127.0.0.1
    python loadtest/bench_hit_path.py --quick    # fewer calls, for CI

The parts, in the order a hit meets them:

    key           the key rendered from the call's arguments (``loader.key``)
    singleflight  joining and finishing the key's flight (the in-process collapse)
    breaker       the circuit breaker's check and its success
    pool          a connection taken from the layer's bounded pool and given back
    round trip    GET sent and its reply read on a connection already taken
    client        the rest of redis-py's ``client.get`` (its command machinery):
                  ``client.get`` minus pool minus round trip
    decode        the envelope checked and the value decoded (orjson.loads)
    counter       the ``hits`` counter

Each is timed alone (``--calls`` calls, the median of ``--repeats`` repeats), so their
sum differs from a whole hit by the calls between them and by the noise of a shared
machine. The whole hit and the bare GET + orjson.loads are timed in interleaved rounds
(alternating which goes first); their ratio is the figure ``bench_core.py`` prints too.
The parts reach into the layer's internals: this is a profile, not an API. The last
line printed is the figures as JSON.

    python loadtest/bench_hit_path.py --verify           # what verify_sample=0.001 costs a hit
    python loadtest/bench_hit_path.py --verify --quick

``--verify`` times warm hits (remote, then near) of a layer with ``verify_sample`` at
``--sample`` against one with it off, in interleaved rounds, and counts the loader calls
its verifications made per hit.

    python loadtest/bench_hit_path.py --tracing          # what OpenTelemetry tracing costs a hit
    python loadtest/bench_hit_path.py --tracing --quick

``--tracing`` times a warm hit (and a near hit) under each way an application may leave
tracing: ``off`` (no tracer provider set), ``noop`` (the API's NoOpTracerProvider),
``sampled-out`` (the SDK, sampling nothing) and ``recording`` (the SDK sampling every
call, its spans handed to a processor that drops them, so no exporter is timed). A
process can set its global provider once, so each mode runs in a process of its own,
the modes in turn, in rounds (the first mode of each round rotates); the figures are
the medians, and each mode's cost as a ratio to ``off`` from the same rounds.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
import redis

from stampede import Stampede
from stampede._core.flow import first_read
from stampede.testing import server_url

VALUE = {"id": 42, "name": "category map", "children": [{"id": i, "name": f"c{i}"} for i in range(20)]}


def per_call_us(run: Callable[[], object], calls: int, repeats: int) -> float:
    """Microseconds per call of ``run``: the median over ``repeats`` loops of ``calls``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def hit_parts(url: str, options: argparse.Namespace) -> None:
    bare = redis.Redis.from_url(url, socket_timeout=5)
    bare.set("bench-hit:raw", orjson.dumps(VALUE))
    with Stampede.from_url(url, namespace="bench-hit") as layer:

        @layer.cached_loader("item:{item_id}", ttl=3600)
        def load(item_id: int) -> dict[str, Any]:
            return VALUE

        assert load(42) == VALUE  # now warm
        runner = layer._runner
        assert runner is not None
        store, flights, events = runner.store, runner.flights, runner._events
        client = store.client  # type: ignore[attr-defined]
        pool, breaker = client.connection_pool, store.breaker  # type: ignore[attr-defined]
        key = load.key(42)
        raw = client.get(key)
        codec = load._spec.codec

        def singleflight() -> None:
            flight, _ = flights.join(key)
            flights.finish(key, flight, value=None)

        def breaker_pass() -> None:
            breaker.check(key)
            breaker.succeeded()

        def pool_cycle() -> None:
            pool.release(pool.get_connection())

        connection = pool.get_connection()

        def round_trip() -> None:
            connection.send_command("GET", key)
            connection.read_response()

        def bare_hit() -> None:
            orjson.loads(bare.get("bench-hit:raw"))  # type: ignore[arg-type]

        def timed(run: Callable[[], object]) -> float:
            return per_call_us(run, options.calls, options.repeats)

        try:
            parts = {
                "key": timed(lambda: load.key(42)),
                "singleflight": timed(singleflight),
                "breaker": timed(breaker_pass),
                "round trip": timed(round_trip),
            }
        finally:
            pool.release(connection)
        parts["pool"] = timed(pool_cycle)
        parts["client"] = timed(lambda: client.get(key)) - parts["pool"] - parts["round trip"]
        parts["decode"] = timed(lambda: codec.decode_hit(raw))
        parts["counter"] = timed(lambda: events.incr("hits"))
        parts["read + decode + counter"] = timed(lambda: first_read(raw, codec, events, runner._warn, key))

        whole, plain, ratios = [], [], []
        for round_number in range(options.rounds):
            if round_number % 2:  # alternate which goes first, so drift favours neither
                hit_us = per_call_us(lambda: load(42), options.calls, 1)
                bare_us = per_call_us(bare_hit, options.calls, 1)
            else:
                bare_us = per_call_us(bare_hit, options.calls, 1)
                hit_us = per_call_us(lambda: load(42), options.calls, 1)
            whole.append(hit_us)
            plain.append(bare_us)
            ratios.append(bare_us / hit_us)  # calls/s of stampede over calls/s of the bare GET
    bare.close()

    order = ["key", "singleflight", "breaker", "pool", "round trip", "client", "decode", "counter"]
    print(f"\nA warm hit, one thread: each part alone, us per call (median of {options.repeats} x {options.calls})")
    for name in order:
        print(f"   {name:<14} {parts[name]:>7.2f}")
    print(f"   {'sum':<14} {sum(parts[name] for name in order):>7.2f}")
    print(f"   ({'first_read, the decode and counter together':<14}: {parts['read + decode + counter']:.2f})")
    bare_parts = parts["pool"] + parts["round trip"] + parts["client"]
    print(f"\n   whole hit                    {statistics.median(whole):>7.2f} us (median of {options.rounds} rounds)")
    print(f"   bare GET + orjson.loads      {statistics.median(plain):>7.2f} us")
    print(f"   stampede's own parts         {parts['key'] + parts['singleflight'] + parts['breaker']:>7.2f} us "
          "(key, singleflight, breaker)")  # fmt: skip
    print(f"   redis-py's parts             {bare_parts:>7.2f} us (pool, round trip, client)")
    spread = f"min {min(ratios):.3f}, max {max(ratios):.3f}"
    print(f"   ratio (calls/s, stampede / bare)  {statistics.median(ratios):.3f} (median; {spread})")
    figures = {
        "parts_us": {name: round(parts[name], 3) for name in order},
        "whole_us": round(statistics.median(whole), 2),
        "bare_us": round(statistics.median(plain), 2),
        "ratio": round(statistics.median(ratios), 4),
    }
    print(json.dumps(figures))


TRACING_MODES = ("off", "noop", "sampled-out", "recording")


def set_tracing(mode: str) -> None:
    """Leave the global tracer provider as an application in ``mode`` would."""
    if mode == "off":
        return
    from opentelemetry import trace

    if mode == "noop":
        trace.set_tracer_provider(trace.NoOpTracerProvider())
        return
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    provider = TracerProvider(sampler=ALWAYS_OFF if mode == "sampled-out" else ALWAYS_ON)
    provider.add_span_processor(SpanProcessor())  # the base class: takes every span, keeps none
    trace.set_tracer_provider(provider)


def traced_hits(url: str, options: argparse.Namespace) -> None:
    """One mode's figures (a child process of ``tracing_side_by_side``): us per warm hit and
    per near hit, the median of ``repeats`` loops of ``calls``, as one JSON line."""
    set_tracing(options.trace_mode)
    figures = {}
    for near in (False, True):
        with Stampede.from_url(url, namespace=f"bench-trace-{options.trace_mode}") as layer:

            @layer.cached_loader("item:{item_id}", ttl=3600, near_cache=near)
            def load(item_id: int) -> dict[str, Any]:
                return VALUE

            deadline = time.monotonic() + 10
            while load(42) and near and layer.stats()["near_hits"] < 100 and time.monotonic() < deadline:
                pass  # the near cache's lease up, copies served
            figures["near_us" if near else "hit_us"] = per_call_us(lambda: load(42), options.calls, options.repeats)
    print(json.dumps(figures), flush=True)


def tracing_side_by_side(url: str, options: argparse.Namespace) -> None:
    import subprocess
    import sys

    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in TRACING_MODES}
    for round_number in range(options.rounds):
        start = round_number % len(TRACING_MODES)
        for mode in TRACING_MODES[start:] + TRACING_MODES[:start]:
            command = [sys.executable, __file__, "--redis", url, "--trace-mode", mode]
            command += ["--calls", str(options.calls), "--repeats", str(options.repeats)]
            out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300).stdout
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))
    print(f"\nA warm hit under each tracing mode, us per call (median of {options.rounds} rounds, each a process)")
    print(f"   {'mode':<12} {'hit':>8} {'ratio':>7} {'near hit':>9} {'ratio':>7}")
    figures: dict[str, dict[str, float]] = {}
    for mode in TRACING_MODES:
        row: dict[str, float] = {}
        for part in ("hit_us", "near_us"):
            row[part] = statistics.median(run[part] for run in runs[mode])
            ratios = [run[part] / off[part] for run, off in zip(runs[mode], runs["off"], strict=True)]
            row[part.replace("_us", "_ratio")] = statistics.median(ratios)
        figures[mode] = {name: round(value, 3) for name, value in row.items()}
        hit, near = (
            f"{row['hit_us']:>8.2f} {row['hit_ratio']:>6.3f}x",
            f"{row['near_us']:>9.2f} {row['near_ratio']:>6.3f}x",
        )
        print(f"   {mode:<12} {hit} {near}")
    print(json.dumps(figures))


def verify_side_by_side(url: str, options: argparse.Namespace) -> None:
    """What ``verify_sample`` costs a hit: warm hits (remote, then near) of a layer with it
    off and of one at ``--sample``, in interleaved rounds, and the loader calls the
    verifications made per hit."""
    figures = {"near hit" if near else "hit": verify_costs(url, options, near) for near in (False, True)}
    print(f"\nA warm hit with verify_sample={options.sample} against off ({options.rounds} interleaved rounds of "
          f"{options.calls} calls)")  # fmt: skip
    for name, row in figures.items():
        print(f"   {name:<9} off {row['off_us']:>6.2f} us, on {row['on_us']:>6.2f} us: ratio (calls/s, on / off) "
              f"{row['ratio']:.3f} (worst {row['worst_ratio']:.3f}); loader calls by verifications "
              f"{row['verifications']} in {row['hits']} hits ({row['verifications_per_hit']:.5f} a hit)")  # fmt: skip
    print(json.dumps(figures))


def verify_costs(url: str, options: argparse.Namespace, near: bool) -> dict[str, float]:
    import stampede

    verified = [0]

    def load(item_id: int) -> dict[str, Any]:
        if stampede.verifying():
            verified[0] += 1
        return VALUE

    layers = {
        name: Stampede.from_url(url, namespace=f"bench-verify-{name}", verify_sample=sample)
        for name, sample in (("off", 0.0), ("on", options.sample))
    }
    try:
        loads = {
            name: layer.cached_loader("item:{item_id}", ttl=3600, near_cache=near)(load)
            for name, layer in layers.items()
        }
        for name, layer in layers.items():
            deadline = time.monotonic() + 10
            while loads[name](42) and near and layer.stats()["near_hits"] < 100 and time.monotonic() < deadline:
                pass  # the near cache's lease up, copies served
        times: dict[str, list[float]] = {"off": [], "on": []}
        for round_number in range(options.rounds):
            for name in ["off", "on"] if round_number % 2 else ["on", "off"]:
                times[name].append(per_call_us(functools.partial(loads[name], 42), options.calls, 1))
    finally:
        for layer in layers.values():
            layer.close()
    ratios = [off / on for off, on in zip(times["off"], times["on"], strict=True)]  # calls/s, on over off
    stats = layers["on"].stats()
    hits = stats["hits"] + stats["near_hits"]
    return {
        "off_us": round(statistics.median(times["off"]), 3),
        "on_us": round(statistics.median(times["on"]), 3),
        "ratio": round(statistics.median(ratios), 4),
        "worst_ratio": round(min(ratios), 4),
        "hits": hits,
        "verifications": verified[0],
        "verifications_per_hit": round(verified[0] / max(1, hits), 6),
        "checks": sum(stats[f"consistency_{result}"] for result in ("match", "mismatch", "superseded", "error")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds (CI)")
    parser.add_argument("--tracing", action="store_true", help="a hit under each tracing mode, side by side")
    parser.add_argument("--trace-mode", choices=TRACING_MODES, help=argparse.SUPPRESS)  # one mode's process
    parser.add_argument("--verify", action="store_true", help="a hit with verify_sample against one without")
    parser.add_argument("--sample", type=float, default=0.001, help="verify_sample, with --verify")
    options = parser.parse_args()
    if options.quick:
        options.calls, options.repeats, options.rounds = 500, 3, 3
        if options.tracing:
            options.rounds = 2
    with server_url(options.redis) as url:
        if options.trace_mode:
            traced_hits(url, options)
        elif options.tracing:
            tracing_side_by_side(url, options)
        elif options.verify:
            verify_side_by_side(url, options)
        else:
            hit_parts(url, options)


if __name__ == "__main__":
    main()
