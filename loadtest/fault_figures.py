"""Figures for the failure-semantics table: each fault scenario's worst caller latency
against its deadline, loader calls against their bound, and what callers saw.

    python loadtest/fault_figures.py               # every scenario, 3 rounds
    python loadtest/fault_figures.py --rounds 1 -k loader_raising

The scenarios are the fault tests themselves (real servers and processes the suite
starts): this runs them with pytest, each recording what it measured through the
suite's ``figures`` fixture (STAMPEDE_FIGURES), and prints one Markdown row per
scenario, the worst of all rounds. The tests assert their bounds, so a round that
breaks one fails, and this exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SCENARIOS = [
    "tests/promises/test_processes.py::test_a_killed_holder_is_taken_over_by_a_waiter_in_another_process",
    "tests/promises/test_async.py::test_a_killed_holder_process_is_taken_over_by_async_waiters",
    "tests/faults/test_faults.py::test_a_holder_paused_past_its_lease_neither_overwrites_nor_releases_anothers_lock",
    "tests/faults/test_faults.py::test_redis_killed_and_restarted_mid_stampede",
    "tests/faults/test_breaker.py::test_a_stalled_server_costs_threshold_socket_timeouts_then_none",
    "tests/families/test_redis.py::test_redis_stopped_mid_run_fails_open_and_caching_resumes",
    "tests/families/test_redis.py::test_policy_raise_surfaces_a_dead_redis",
    "tests/faults/test_faults.py::test_connections_cut_mid_stampede",
    "tests/faults/test_faults.py::test_latency_beyond_the_socket_timeout_is_bounded_and_opens_the_circuit",
    "tests/faults/test_faults.py::test_a_loader_failing_under_load_is_never_run_twice_at_once",
    "tests/faults/test_invalidation_stress.py::test_no_stale_value_after_an_invalidation_across_processes_under_faults",
    "tests/faults/test_soak.py::test_soak_with_random_faults",
]


def run_round(selected: list[str], record: Path) -> int:
    env = dict(os.environ, STAMPEDE_FIGURES=str(record))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selected]
    return subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def worst_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per scenario: the slowest caller and the most loads of any round."""
    merged: dict[str, dict[str, Any]] = {}
    for row in rows:
        seen = merged.setdefault(row["scenario"], dict(row, rounds=0, worsts=[]))
        seen["rounds"] += 1
        seen["worsts"].append(row["worst"])
        if row["worst"] >= seen["worst"]:
            seen["worst"] = row["worst"]
        if row["loads"] >= seen["loads"]:
            seen["loads"], seen["exceptions"], seen["bound"] = row["loads"], row["exceptions"], row["bound"]
    return list(merged.values())


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | worst caller latency | deadline | loader calls | bound | callers saw |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['scenario']} | {row['worst']:.3f} s | {row['deadline']:g} s | {row['loads']} | {row['bound']} "
            f"| {row['exceptions']} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-k", dest="only", help="only the scenarios whose test name contains this")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    options = parser.parse_args()
    selected = [test for test in SCENARIOS if not options.only or options.only in test]
    if not selected:
        parser.error(f"no scenario matches {options.only!r}")
    failed = 0
    with tempfile.TemporaryDirectory() as folder:
        record = Path(folder) / "figures.jsonl"
        for number in range(1, options.rounds + 1):
            code = run_round(selected, record)
            print(f"round {number}/{options.rounds}: {'passed' if code == 0 else f'FAILED (pytest exit {code})'}")
            failed += code != 0
        rows = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    merged = worst_of(rows)
    print(f"\n{len(selected)} scenarios, {options.rounds} round(s); worst of all rounds:\n")
    print(table(merged))
    if options.json:
        options.json.write_text(json.dumps(merged, indent=2))
    missing = len(selected) - len(merged)
    if missing:
        print(f"\n{missing} scenario(s) recorded nothing (failed before measuring?)")
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
