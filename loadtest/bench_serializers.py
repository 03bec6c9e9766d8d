"""The cost of the serializers on the paths that use them: ``loads`` on every hit, and
``dumps`` plus the read-back on every load (the caller who loaded gets the value as hits
read it). orjson (the default) against msgspec decoding into the loader's return type.

    python loadtest/bench_serializers.py            # 7 interleaved rounds
    python loadtest/bench_serializers.py --quick    # 1 round, for CI

Prints calls/s of each and the median ratio msgspec / orjson over the rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from stampede import JsonSerializer, MsgspecSerializer
from stampede._core.codec import Codec


@dataclasses.dataclass(frozen=True)
class Order:
    id: uuid.UUID
    placed: datetime.datetime
    lines: tuple[int, ...]
    total: float


CATEGORY_MAP = {f"category-{n}": {"id": n, "parent": n // 10, "name": f"Category {n}", "path": [1, 2, n]}
                for n in range(200)}  # fmt: skip
ORDER = Order(uuid.UUID(int=7), datetime.datetime(2026, 11, 23, 9, 30), tuple(range(20)), 12.5)
CASES: dict[str, tuple[Any, Any]] = {
    "category map (200 entries)": (CATEGORY_MAP, dict[str, Any]),
    "order dataclass": (ORDER, Order),
}


def rate(work: Callable[[], Any], seconds: float) -> float:
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(100):
            work()
        calls += 100
    return calls / elapsed


def _hit(codecs: dict[str, Codec], envelopes: dict[str, bytes], kind: str) -> Callable[[], Any]:
    return lambda: codecs[kind].decode_hit(envelopes[kind])


def _load(codecs: dict[str, Codec], value: Any, kind: str) -> Callable[[], Any]:
    return lambda: codecs[kind].read_back(codecs[kind].encode(value, 0.0, 0.0, key="k"), key="k")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=0.5, help="per measurement")
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args()
    rounds, seconds = (1, 0.1) if options.quick else (options.rounds, options.seconds)
    print(f"{rounds} interleaved round(s), {seconds} s a measurement, Python {sys.version.split()[0]}")
    print(f"{'value':28} {'path':18} {'orjson/s':>10} {'msgspec/s':>10} {'ratio':>6}")
    for name, (value, annotation) in CASES.items():
        codecs = {"orjson": Codec(JsonSerializer()), "msgspec": Codec(MsgspecSerializer(annotation))}
        envelopes = {kind: codec.encode(value, 0.0, 0.0, key="k") for kind, codec in codecs.items()}
        paths: dict[str, Callable[[str], Callable[[], Any]]] = {
            "hit (loads)": functools.partial(_hit, codecs, envelopes),
            "load (dumps+back)": functools.partial(_load, codecs, value),
        }
        for path, make in paths.items():
            results: dict[str, list[float]] = {"orjson": [], "msgspec": []}
            for round_ in range(rounds):
                order = ["orjson", "msgspec"] if round_ % 2 == 0 else ["msgspec", "orjson"]
                for kind in order:
                    results[kind].append(rate(make(kind), seconds))
            ratio = statistics.median(m / o for m, o in zip(results["msgspec"], results["orjson"], strict=True))
            print(f"{name:28} {path:18} {statistics.median(results['orjson']):>10.0f} "
                  f"{statistics.median(results['msgspec']):>10.0f} {ratio:>6.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
