"""The history checker under faults (``stampede.testing.nemesis``), over every backend
family but ZooKeeper: a workload of reads of one and many keys, updates, sets and
expiries in eight threads while a nemesis pauses servers, cuts and stalls connections,
fails a Sentinel master over (gracefully, and frozen), migrates a Cluster slot and kills
a Cluster primary. The short form of ``loadtest/check_histories.py --faults``: every
profile ran its faults, and no promise broke outside the faults' spans.

    python loadtest/check_histories.py --faults          # the long form: 60 s a profile
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.timeout(240)
def test_no_promise_breaks_outside_the_faults_spans_on_any_backend() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "loadtest" / "check_histories.py"), "--faults", "--quick"],
        capture_output=True, text=True, timeout=220, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    print("\n" + "\n".join(done.stdout.strip().splitlines()[:-1]))
    assert {name.partition(":")[0] for name in figures} >= {"redis", "sentinel", "cluster", "redlock"}
    for name, row in figures.items():
        assert row["violations"] == {}, (name, row)
        assert sum(row["faults"].values()) > 0, (name, row)  # the nemesis did strike
        assert row["operations"] > 1000 and row["loads"] > 0, (name, row)
