"""Figures for the deterministic simulator (``stampede.testing.simulation``): how many
checked operations a second of one core it runs, and how soon it finds each defect
planted on purpose (``stampede.testing.planted``).

    python loadtest/bench_simulation.py                 # 200 seeds of speed, 1,000 per defect
    python loadtest/bench_simulation.py --quick         # fewer seeds, for CI

1. Speed: ``--seeds`` runs of 2,000 workload operations (3 processes x 4 callers, every
   fault on), CPU seconds of this process: workload operations per second, and checked
   operations per second (the checker's count: the calls, and the loads and database
   writes they made); again with near caches (``near_cache=True``).
2. For each planted defect, the first seed whose run fails, and the CPU seconds it took
   to get there (up to ``--defect-seeds`` seeds; "not found" past them).

The last line is JSON with every figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from stampede.testing.planted import DEFECTS, OPTIONS, planted
from stampede.testing.simulation import Simulation


def speed(seeds: int, **settings: object) -> dict[str, float]:
    started = time.process_time()
    operations = checked = 0
    for seed in range(seeds):
        result = Simulation(seed=seed, settings=settings).run()
        assert result.ok, result.explain()
        operations += result.operations
        checked += result.report.operations
    seconds = time.process_time() - started
    return {
        "seeds": seeds,
        "operations": operations,
        "checked": checked,
        "cpu_s": round(seconds, 2),
        "operations_per_s": round(operations / seconds),
        "checked_per_s": round(checked / seconds),
    }


def first_failure(defect: str, seeds: int) -> dict[str, object]:
    started = time.process_time()
    with planted(*DEFECTS[defect]):
        for seed in range(seeds):
            result = Simulation(seed=seed, **OPTIONS.get(defect, {})).run()
            if not result.ok:
                broken = [*result.report.violations, *result.locks]  # the cache's promise, then the lock's
                rule = broken[0].rule if broken else result.errors[0].split(":")[0]  # "stuck": a hang
                return {"defect": defect, "seeds": seed + 1, "cpu_s": round(time.process_time() - started, 2),
                        "rule": rule}  # fmt: skip
    return {"defect": defect, "seeds": None, "cpu_s": round(time.process_time() - started, 2), "rule": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200, help="runs timed for speed")
    parser.add_argument("--defect-seeds", type=int, default=1000, help="seeds tried per planted defect")
    parser.add_argument("--quick", action="store_true", help="20 runs of speed, 100 seeds per defect (CI)")
    options = parser.parse_args()
    if options.quick:
        options.seeds, options.defect_seeds = 20, 100
    logging.getLogger("stampede").setLevel(logging.ERROR)  # the faults' warnings are expected
    defects = [first_failure(name, options.defect_seeds) for name in DEFECTS]
    figures = {"speed": speed(options.seeds), "speed_near": speed(options.seeds, near_cache=True), "defects": defects}
    for what, label in (("speed", ""), ("speed_near", ", near caches")):
        measured = figures[what]
        print(f"{measured['operations']} operations ({measured['checked']} checked) in {measured['cpu_s']} s of CPU"
              f"{label}: {measured['operations_per_s']:,}/s, {measured['checked_per_s']:,} checked/s")  # fmt: skip
    for found in figures["defects"]:
        where = "not found" if found["seeds"] is None else f"found by seed {found['seeds']} ({found['rule']})"
        print(f"{found['defect']}: {where}, {found['cpu_s']} s")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
