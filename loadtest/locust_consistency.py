"""Consistency measured in production, in the Locust shop: a writer updates products while
hundreds of users read them, and the products' hits are verified (``verify_sample``);
the same run's history, recorded in every Locust process, is checked beside it.

    python loadtest/locust_consistency.py            # 60 s a writer, 100 users, 2 processes
    python loadtest/locust_consistency.py --quick    # 15 s a writer (CI)

Two Locust runs (loadtest/locustfile.py, headless, each starting its own throwaway Redis
server, shop database and web app on 127.0.0.1, and stopping them):

* **correct writer** (``--writer correct``): ``WriterUser`` updates a product's row (a new
  price and version), then invalidates its entry, as the examples do. Every product hit
  of the Locust processes is verified (``--verify-sample 1``): the figure is the nines
  the verdicts prove.
* **broken writer** (``--writer broken``): the update forgets the invalidation; readers
  get the old row until the entry expires. One hit in five is verified; the history
  checker counts the reads served an older version than an update that had returned
  (its rule "stale") among the same processes' product reads, a rate of their hits
  (a load's value is fresh, and a verification samples hits only). The line prints
  the verifications' mismatch rate beside the checker's stale rate, and their ratio.

The Locust processes record their product calls, loads and writes (``--history``: a
``stampede.testing.Recorder`` each, streamed to a file); the web users' reads are
recorded by the Locust process that made them, apart. The exit status is 1 if Locust
failed, if the correct writer shows a mismatch or any violation, or if the broken
writer's mismatch rate is not within 10% of the stale rate (or, where its verdicts are
too few to tell 10%, within four standard deviations of their sample).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_consistency import RESULTS, tolerance, verdicts
from run_locust import master_port

from stampede import Settings
from stampede.testing import History

HERE = Path(__file__).resolve().parent


def run(writer: str, sample: float, options: argparse.Namespace) -> dict[str, Any]:
    """One Locust run with ``writer``; the verifications' counts and the checker's."""
    with tempfile.TemporaryDirectory() as directory:
        command = [
            sys.executable, "-m", "locust", "-f", str(HERE / "locustfile.py"), "--headless", *master_port(),
            "--processes", str(options.processes), "-u", str(options.users), "-r", str(options.users),
            "-t", f"{options.run_time}s", "--stop-timeout", "5", "--only-summary", "--ttl", str(options.ttl),
            "--writer", writer, "--verify-sample", str(sample), "--history", directory,
        ]  # fmt: skip
        done = subprocess.run(command, cwd=HERE.parent, capture_output=True, text=True, timeout=options.run_time + 120)
        paths = sorted(Path(directory).glob("*.jsonl"))
        history = History.load(*paths) if paths else History()
        checks = dict.fromkeys(RESULTS, 0)
        hits = 0
        for path in Path(directory).glob("checks-*.json"):
            found = json.loads(path.read_text())
            hits += found.pop("hits")
            for name, value in found.items():
                checks[name.removeprefix("consistency_")] += value
    if done.returncode != 0:
        print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
    report = history.check(ttl=options.ttl * (1 - Settings().jitter))  # an entry's shortest life
    direct = [r for r in history.records if r.kind == "read" and r.process.startswith("direct-")]
    reads = sum(1 for r in direct if r.completed is not None and r.outcome == "ok")
    stale = sum(
        1 for v in report.violations if v.rule == "stale" and v.records[-1].process.startswith("direct-")
    )  # fmt: skip
    verdicts = checks["match"] + checks["mismatch"]
    return {
        "writer": writer,
        "locust_exit_code": done.returncode,
        "operations": report.operations,
        "direct_reads": reads,
        "web_reads": sum(1 for r in history.records if r.kind == "read" and r.process.startswith("web-")),
        "writes": sum(1 for r in history.records if r.kind == "write"),
        "checks": checks,
        "mismatch_rate": checks["mismatch"] / verdicts if verdicts else 0.0,
        "nines": -math.log10(max(checks["mismatch"], 1) / verdicts) if verdicts else 0.0,
        "hits": hits,
        "stale_reads": stale,
        "stale_rate": stale / hits if hits else 0.0,  # of hits, as verifications sample hits
        "violations": report.counts(),
    }


def line(figures: dict[str, Any]) -> str:
    head = (
        f"{figures['writer']:>7} writer: {figures['writes']} writes, {figures['direct_reads']} product reads in "
        f"the Locust processes ({figures['hits']} hits; {figures['web_reads']} more over HTTP); "
    )
    return head + verdicts(figures, f"checker: violations {figures['violations'] or 0}")


def slack(figures: dict[str, Any]) -> float:
    """How far from 1 the ratio may be: 10%, or four standard deviations of the verdicts'
    binomial sample (``bench_consistency.tolerance``)."""
    return tolerance(figures["mismatch_rate"], figures["checks"]["match"] + figures["checks"]["mismatch"], 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--run-time", type=int, default=60, help="seconds per writer")
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--broken-sample", type=float, default=0.2, help="the broken writer's verify_sample")
    parser.add_argument("--quick", action="store_true", help="a short form (CI): 15 s a writer")
    options = parser.parse_args()
    if options.quick:
        options.run_time = 15
    correct = run("correct", 1.0, options)
    print(line(correct), flush=True)
    broken = run("broken", options.broken_sample, options)
    print(line(broken), flush=True)
    ratio = broken["mismatch_rate"] / broken["stale_rate"] if broken["stale_rate"] else math.inf
    failures = [f"{f['writer']}: Locust exited {f['locust_exit_code']}" for f in (correct, broken)
                if f["locust_exit_code"]]  # fmt: skip
    if correct["checks"]["mismatch"] or correct["violations"]:
        failures.append("the correct writer shows a mismatch or a violation")
    allowed = slack(broken)
    print(f"the ratio may differ from 1 by {allowed:.3f} (10%, or four standard deviations of the sample)")
    if not 1 - allowed <= ratio <= 1 + allowed:
        failures.append(f"the broken writer's mismatch rate is {ratio:.3f}x the checker's stale rate")
    print(json.dumps({"correct": correct, "broken": broken, "ratio": ratio, "tolerance": allowed}))
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
