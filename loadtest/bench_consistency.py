"""Consistency measured in production (``verify_sample``), checked against the history
checker on the same run: what the verifications report, and what really happened.

    python loadtest/bench_consistency.py            # 1.5 x 10^6, then 2 x 10^5 at each of three rates
    python loadtest/bench_consistency.py --quick    # a short form (CI)

Two runs over one throwaway Redis server (started here on 127.0.0.1, stopped by its PID),
each a generated workload (``stampede.testing.run_workload``: eight threads, reads of one
and of many keys over a few keys that collide, updates, a database query of a
millisecond) with every call recorded:

* **correct writer**: an update writes the row, then invalidates the entry, as the
  examples do. Every hit is verified (``verify_sample=1``): there should be no mismatch,
  and the figure is the nines the verdicts prove, ``log10(verdicts)`` when there is none.
* **broken writer**: an update writes the row and does not invalidate. Readers are served
  the old row until the entry expires. The history checker counts those reads (its rule
  "stale": a read that began after an update returned and got an older version); the
  verifications should report the same rate as their mismatches, at every sample rate
  (``--broken-samples``: 0.001, 0.01 and 0.05, a run each): each line prints both, their
  ratio and its error (the ratio less 1).

Every setting of the layer is its default but ``verify_sample`` (``verify_grace`` is 0.5
s: a mismatch's verification waits that long, holding none of the four places, so the
hits sampled meanwhile are not skipped more where the entry is fresh).

The exit status is 1 if the correct writer shows a mismatch or a violation, or if a
broken writer's mismatch rate is not within 10% of the checker's stale rate; in a run
too short to tell 10% (``--quick``, and the rarest rate), within six standard deviations
of a binomial sample of the verifications run (see ``tolerance``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
import uuid
from typing import Any

from stampede import Stampede
from stampede.testing import History, Mix, Recorder, RedisServer, Rows, Subject, layer_subject, run_workload

MIX = Mix(read=93.8, read_many=6, update=0.2, set=0, expire=0)
TTL, JITTER = 5.0, 0.1
RESULTS = ("match", "mismatch", "superseded", "error", "skipped")


def run(url: str, broken: bool, operations: int, sample: float, seed: int) -> dict[str, Any]:
    """One writer's run: the verifications' counts and the checker's."""
    recorder = Recorder()
    rows = Rows(recorder, delay=0.001)
    layer = Stampede.from_url(url, namespace=f"c{uuid.uuid4().hex[:8]}", ttl=TTL, jitter=JITTER, verify_sample=sample)
    started = time.monotonic()
    try:
        subject = layer_subject(layer, rows)
        if broken:  # the same loaders, and a write path that forgets the cache
            subject = Subject(read=subject.read, update=rows.write, read_many=subject.read_many)
        ran = run_workload(subject, recorder, keys=12, threads=8, operations=operations, seed=seed, mix=MIX)
    finally:
        layer.close()  # waits for the verifications under way
    seconds = time.monotonic() - started
    stats = layer.stats()
    report = History.of(recorder).check(ttl=TTL * (1 - JITTER), wait_bound=5.0)  # the shortest life
    checks = {result: stats[f"consistency_{result}"] for result in RESULTS}
    verdicts = checks["match"] + checks["mismatch"]
    stale = report.counts().get("stale", 0)
    return {
        "writer": "broken" if broken else "correct",
        "sample": sample,
        "operations": ran,
        "seconds": round(seconds, 1),
        "reads": report.reads,
        "hits": stats["hits"] + stats["near_hits"],
        "loads": stats["loads"],
        "checks": checks,
        "verifications_per_hit": round(sum(checks.values()) / max(1, stats["hits"]), 4),
        "mismatch_rate": checks["mismatch"] / verdicts if verdicts else 0.0,
        "nines": -math.log10(max(checks["mismatch"], 1) / verdicts) if verdicts else 0.0,
        "stale_reads": stale,
        "stale_rate": stale / report.reads if report.reads else 0.0,
        "verifications": sum(1 for record in recorder.records if record.kind == "verify"),
        "other_violations": {rule: n for rule, n in report.counts().items() if rule != "stale"},
    }


def tolerance(rate: float, samples: int, deviations: float) -> float:
    """How far from 1 the ratio of the two rates may be: 10%, unless ``samples`` are too
    few to tell 10%: then ``deviations`` standard deviations of a binomial sample of that
    size, relative to the ``rate``.

    Here the samples are the verifications run, not the verdicts: hits of a key during a
    verification share its verdict, so verdicts come in clusters, and clusters of unequal
    size spread the ratio further than a binomial sample's (1.6 times, over 13 runs of the
    short form when a mismatch's wait held a place; six of the latter are nearly four of
    the former)."""
    if not samples or not rate:
        return 0.1
    return max(0.1, deviations * math.sqrt((1 - rate) / (rate * samples)))


def line(figures: dict[str, Any]) -> str:
    head = (
        f"{figures['writer']:>7} writer, verify_sample={figures['sample']}: {figures['operations']} operations "
        f"in {figures['seconds']} s, {figures['reads']} reads; "
    )
    return head + verdicts(figures, f"checker: {figures['stale_reads']} stale reads")


def verdicts(figures: dict[str, Any], checked: str) -> str:
    """What the verifications of a run found, beside the checker's ``checked`` (for the
    correct writer) or its stale rate (for the broken one)."""
    checks = figures["checks"]
    text = (
        f"verified {checks['match'] + checks['mismatch']} hits (match {checks['match']}, "
        f"mismatch {checks['mismatch']}; superseded {checks['superseded']}, error {checks['error']}, "
        f"skipped {checks['skipped']}): "
    )
    if figures["writer"] == "correct":
        bound = "at least " if not checks["mismatch"] else ""
        return text + f"{bound}{figures['nines']:.1f} nines; {checked}"
    ratio = figures["mismatch_rate"] / figures["stale_rate"] if figures["stale_rate"] else math.inf
    return text + (
        f"mismatch rate {figures['mismatch_rate']:.4f}, checker's stale rate {figures['stale_rate']:.4f} "
        f"({figures['stale_reads']} stale reads): ratio {ratio:.3f}, error {ratio - 1:+.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--operations", type=int, default=1_500_000, help="of the correct writer's run")
    parser.add_argument("--sample", type=float, default=1.0, help="its verify_sample")
    parser.add_argument("--broken-operations", type=int, default=200_000, help="of each broken writer's run")
    parser.add_argument(
        "--broken-samples", default="0.001,0.01,0.05", help="the verify_sample of each broken writer's run"
    )
    parser.add_argument("--quick", action="store_true", help="a short form (CI): 20,000 operations per run")
    parser.add_argument("--seed", type=int, default=1)
    options = parser.parse_args()
    logging.getLogger("stampede.cache").setLevel(logging.ERROR)  # the broken writer's mismatches are counted
    if options.quick:
        options.operations = options.broken_operations = 20_000
    rates = [float(rate) for rate in options.broken_samples.split(",")]
    with RedisServer() as server:
        correct = run(server.url, False, options.operations, options.sample, options.seed)
        print(line(correct), flush=True)
        broken = []
        for rate in rates:
            broken.append(run(server.url, True, options.broken_operations, rate, options.seed))
            print(line(broken[-1]), flush=True)
    failures = []
    if correct["checks"]["mismatch"] or correct["stale_reads"] or correct["other_violations"]:
        failures.append("the correct writer shows a mismatch or a violation")
    for figures in broken:
        ratio = figures["mismatch_rate"] / figures["stale_rate"] if figures["stale_rate"] else math.inf
        figures["ratio"] = ratio
        figures["tolerance"] = slack = tolerance(figures["mismatch_rate"], figures["verifications"], 6)
        print(f"verify_sample={figures['sample']}: the ratio {ratio:.3f} may differ from 1 by {slack:.3f} "
              "(10%, or six standard deviations of the sample)")  # fmt: skip
        if not 1 - slack <= ratio <= 1 + slack:
            failures.append(f"at verify_sample={figures['sample']} the mismatch rate is {ratio:.3f}x the stale rate")
    print(json.dumps({"correct": correct, "broken": broken}))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
