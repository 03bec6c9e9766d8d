"""The benchmarks of loadtest/: the Locust run's single-hit check reads the query log
right, and each benchmark's short form (what CI can afford) runs and holds with
protection on. Marked ``bench``: a step of its own (README), not the README's test
command, which they would make a third longer."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "loadtest"))

from expiry_windows import expiry_windows, explain, queries_per_second, summarize  # noqa: E402
from run_locust import master_port  # noqa: E402

pytestmark = pytest.mark.bench  # its own step, after the README's command (.ci/run)


def short_form(script: str, timeout: float, *args: str) -> Any:
    """Run ``loadtest/<script> [args] --quick`` and return the figures of its last line of
    JSON (a ``--plot`` says where it drew after it)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "loadtest" / script), *args, "--quick"],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(next(line for line in reversed(done.stdout.splitlines()) if line.startswith(("{", "["))))


@dataclass
class Q:
    started: float
    finished: float
    what: str


@dataclass
class Noted(Q):
    pid: int
    note: str


# The longest first: four workers start them at once, and the short ones fill in after.


@pytest.mark.timeout(300)
# Beside the other benchmarks (not timing): it bounds what broke and what ran, not how fast.
def test_the_history_checks_under_faults_find_no_violation_outside_the_faults_spans() -> None:
    """``loadtest/check_histories.py --faults --quick``: the workload under nemeses on
    every backend family (servers paused, connections cut, Sentinel failovers, a Cluster
    slot moved and a primary killed, a worker process killed mid-load): every profile ran
    its faults, and no promise broke outside their spans (the script exits 1 on a
    violation); a killed worker broke none even inside them."""
    figures = short_form("check_histories.py", 280, "--faults")
    assert {name.partition(":")[0] for name in figures} >= {"redis", "sentinel", "cluster", "redlock"}
    for name, row in figures.items():
        assert row["violations"] == {}, (name, row)
        assert sum(row["faults"].values()) > 0, (name, row)  # the nemesis did strike
        assert row["operations"] > 200 and row["loads"] > 0, (name, row)  # a busy machine runs fewer
    killing = figures["redis: a worker killed"]  # a worker killed weakens nothing
    assert killing["killed_mid_load"] >= 1 and killing["weakened"] == {} and killing["most_loads_per_epoch"] == 1


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not on the PATH")
def test_the_instruction_count_short_form_counts_both_hits() -> None:
    """``loadtest/count_instructions.py --quick``: both hits and both warm pages are
    counted; stampede adds work to the bare hit's and to the bare page's, less than
    each costs; a cold page's entry costs more than cache-aside's (a lease, its write
    and release), and the bare entry is a share of the bare page's count.
    Counts do not move with the machine's load, so it runs beside others (not timing):
    two processes under callgrind, about 40 s of a quiet 2-core machine."""
    figures = short_form("count_instructions.py", timeout=280)
    counted = figures["instructions"]
    bare, cached = counted["bare"], counted["stampede"]
    assert bare > 0 and 0 < figures["own"] == cached - bare < bare
    bare_page, cached_page = counted["bare page"], counted["stampede page"]
    # Counted as two processes, one run each (before 2026-12-05), the many-key loader's
    # page came out 3-4% under the bare page; each run counted apart in one process, it
    # is 17-18% over it (loadtest/FIGURES.md, "The instruction count in one process").
    assert bare_page > bare and 0 < figures["own_page"] == cached_page - bare_page < bare_page
    bare_cold, cold = counted["bare cold page"], counted["stampede cold page"]
    assert figures["bare_cold_entry"] == bare_cold // 50 and figures["cold_entry"] == cold // 50
    assert 0 < figures["bare_cold_entry"] < figures["cold_entry"]


@pytest.mark.timeout(180)  # about 56 s on 2 cores: three failovers, each awaited
def test_the_cluster_benchmark_short_form_loads_once_and_recovers_from_each_failover() -> None:
    """``loadtest/bench_cluster.py --quick``: the cold key on one server and on a cluster,
    and a failover of each kind under traffic, as CI can afford them. The figures are the
    script's; this checks what holds at any size."""
    figures = short_form("bench_cluster.py", timeout=240)["figures"]
    assert figures["cold key"]["one server"]["loads"] == figures["cold key"]["cluster"]["loads"] == 1
    for name, runs in figures["failover"].items():
        for run in runs:
            assert run["recovery"] < 15, name
            assert run["normal"] < run["recovery"] + 3, name  # no breaker cool-down past the promotion
            if name.endswith(", load"):
                assert run["errors"] == 0, name  # on_backend_error="load": nobody sees an error
    assert all(follow < 1.0 for follow in figures["follow"])  # Sentinel: the subscriber on the new master


@pytest.mark.timeout(150)
def test_the_streams_benchmark_short_form_runs_the_stream_once_for_every_caller() -> None:
    """``loadtest/bench_streams.py --quick``: one run of the stream for the fleet (each
    caller receiving every chunk in order), one generator per caller with no protection,
    and the whole value's first chunk no sooner than its whole stream. The lags are the
    script's figures (a benchmark's, not a test's)."""
    figures = short_form("bench_streams.py", 120)
    rows, callers = figures["figures"], figures["processes"] * figures["threads"]
    for way in ("stampede stream", "stream, gc.freeze()", "whole value"):
        assert rows[way]["runs"] == 1 and rows[way]["every chunk in order"] and rows[way]["callers"] == callers
    assert rows["no protection"]["runs"] == callers
    assert rows["whole value"]["first chunk p50"] >= figures["chunks"] * figures["pause"] * 1000


@pytest.mark.timeout(180)
def test_the_gateway_under_locust_calls_the_model_once_per_cold_prompt_per_window() -> None:
    """``loadtest/locust_gateway.py --quick``: streaming users through the LLM gateway,
    prompts going cold every 3 s: at most one model call per prompt's window (it exits 1
    otherwise), no failed request."""
    figures = short_form("locust_gateway.py", 170)
    assert figures["max model calls per window"] == 1 and figures["failures"] == 0
    assert figures["requests"] > 50 and figures["windows"] >= 8


@pytest.mark.timeout(300)
# Beside the other benchmarks (not timing): two Locust runs of 15 s, counts bounded far below what they reach.
def test_the_locust_shops_verifications_agree_with_the_history_checker() -> None:
    """``loadtest/locust_consistency.py --quick``: the Locust shop with a writer. Correct
    (update, then invalidate): every product hit of the Locust processes verified, no
    mismatch, and the history recorded in every process has no violation. Broken (no
    invalidation): the verifications' mismatch rate agrees with the checker's stale rate
    of the same run (within the script's tolerance, or it exits 1)."""
    figures = short_form("locust_consistency.py", 280)
    correct, broken = figures["correct"], figures["broken"]
    assert correct["writes"] > 20 and correct["direct_reads"] > 300 and correct["web_reads"] > 300
    assert correct["checks"]["match"] > 200 and correct["checks"]["mismatch"] == 0 and correct["violations"] == {}
    assert broken["checks"]["mismatch"] > 20 and broken["stale_reads"] > 20
    assert abs(figures["ratio"] - 1) <= figures["tolerance"] <= 0.5


@pytest.mark.timeout(300)  # about 40 s of one core, beside the other benchmarks
def test_the_simulation_benchmark_short_form_finds_the_planted_defects() -> None:
    """``loadtest/bench_simulation.py --quick``: the simulator's speed, and the seed that
    finds each planted defect."""
    figures = short_form("bench_simulation.py", 280)
    assert figures["speed"]["operations"] == 20 * 2000
    found = {found["defect"]: found["seeds"] for found in figures["defects"]}
    assert found["a write that does not check its lease"] is not None
    assert found["a wake-up taken as the value without proof"] is not None
    assert found["a killed holder's budget slot never returned"] is not None
    assert found["invalidate_tag skips the near caches of entries already deleted"] is not None
    assert found["a near copy dropped after the invalidation returns"] is not None
    assert found["a named lock's fence drawn from the holder's clock"] is not None
    assert found["a late release deletes the next holder's lease"] is not None
    assert found["a waiter that subscribes after its re-check"] is not None
    assert figures["speed_near"]["operations"] == 20 * 2000


@pytest.mark.timeout(240)  # beside the other benchmarks: it bounds counts, not times
def test_the_warm_start_benchmark_short_form_loads_each_hot_key_once_within_the_budget() -> None:
    """``loadtest/bench_warm.py --quick``: 4 processes boot on an empty cache with a hot
    set of 300 keys. Warming together they load each key once, at most 8 at once (the
    script's own checks); starting cold, the traffic loads the same keys."""
    done = short_form("bench_warm.py", timeout=220)
    warm, cold = done["figures"]["warm start"], done["figures"]["cold start"]
    assert done["recorded"] == 300 and warm["loads"] == 300 and warm["max_per_key"] == 1 and warm["peak"] <= 8
    assert cold["loads"] > 0 and warm["wrong"] == cold["wrong"] == 0


@pytest.mark.timeout(300)  # beside the other benchmarks: it bounds counts (and reads by the thousand in 5 s)
def test_the_fleet_benchmark_short_form_keeps_the_budget_where_nothing_else_does() -> None:
    """``loadtest/bench_fleet.py --quick``: a storm of 400 cold keys from 4 processes x 8
    threads. Under the fleet budget of 8 (and the bare Redis semaphore beside it) the
    loads at once never pass 8 (the script's own check), with no budget and with a
    per-process limit of 8 they do; every key is loaded once in every way. Then two
    versions of a loader side by side: no decode error, no value of the other type,
    nothing stale after either's invalidation."""
    done = short_form("bench_fleet.py", timeout=280)
    figures, budget = done["figures"], done["budget"]
    assert figures["fleet budget"]["peak"] <= budget and figures["bare semaphore"]["peak"] <= budget
    assert figures["fleet budget"]["over"] == 0  # seconds with more than the budget running, on the timelines
    assert figures["no budget"]["peak"] > budget and figures["per-process limit"]["peak"] > budget
    assert all(row["max_per_key"] == 1 and row["keys"] == 400 for row in figures.values())
    # The deploy: two versions side by side for 5 s, each invalidating the other's entries too.
    for row in done["deploy"].values():
        assert row["reads"] > 1000 and row["invalidations"] > 20, row
        assert row["errors"] == row["wrong_type"] == row["stale"] == 0 and row["max_loads_per_key_between"] == 1


def test_queries_of_one_key_while_its_first_load_runs_share_its_window() -> None:
    # A stampede without protection: three callers miss at once and all query.
    log = [Q(10.00, 10.05, "k"), Q(10.01, 10.06, "k"), Q(10.04, 10.09, "k"), Q(10.02, 10.07, "other")]
    figures = summarize(expiry_windows(log, min_ttl=2.7))
    assert figures["max_queries_per_window"] == 3
    assert figures["windows_with_more_than_one_query"] == 1
    assert figures["worst_windows"] == [{"key": "k", "queries": 3}]
    assert figures["queries"] == 4 and figures["keys"] == 2


def test_a_query_while_the_loaded_value_is_still_valid_is_a_second_hit() -> None:
    log = [Q(0.0, 0.05, "k"), Q(2.0, 2.05, "k")]  # the value lives at least until 0.05 + 2.7
    assert summarize(expiry_windows(log, min_ttl=2.7))["max_queries_per_window"] == 2


def test_one_query_per_expiry_is_one_per_window() -> None:
    log = [Q(0.0, 0.05, "k"), Q(2.76, 2.81, "k"), Q(5.52, 5.57, "k")]
    figures = summarize(expiry_windows(log, min_ttl=2.7))
    assert figures["windows"] == 3 and figures["max_queries_per_window"] == 1
    assert queries_per_second(log, since=0.0) == [1, 0, 1, 0, 0, 1]


def test_a_window_of_two_queries_explains_each_by_its_process_and_note() -> None:
    """What a failing run prints: each query of the window, when, by which process, and
    what that process noted of the cache as it began (``ShopDatabase.note``)."""
    log = [
        Noted(100.0, 100.05, "k", 11, "value ttl -2 ms, lease ae4cc692 ttl 10000 ms"),
        Noted(100.06, 100.11, "k", 12, "value ttl -2 ms, lease 44fe6b6a ttl 9999 ms"),
        Noted(100.2, 100.25, "other", 12, ""),
    ]
    lines = explain(expiry_windows(log, min_ttl=2.7), since=90.0)
    assert lines == [
        "k: 2 queries in the window 10.000 .. 12.750 s",
        "    10.000 ..   10.050 s  pid 11  value ttl -2 ms, lease ae4cc692 ttl 10000 ms",
        "    10.060 ..   10.110 s  pid 12  value ttl -2 ms, lease 44fe6b6a ttl 9999 ms",
    ]


@pytest.mark.timeout(90)
def test_the_short_locust_run_makes_one_query_per_key_per_expiry_window(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "loadtest/run_locust.py", "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=85,
    )  # fmt: skip
    logs = "".join(path.read_text()[-3000:] for path in tmp_path.glob("*.log"))
    assert done.returncode == 0, done.stdout + done.stderr + logs
    figures = json.loads((tmp_path / "figures.json").read_text())["on"]
    assert figures["locust_exit_code"] == 0
    assert figures["max_queries_per_window"] == 1
    assert figures["windows"] >= 100  # TTL 1 s for 12 s over dozens of keys: expiries happened
    assert figures["requests"] >= 1000 and figures["failures"] == 0
    told = [line.strip() for line in done.stdout.splitlines() if line.endswith("database queries so far")]
    assert told and told[0].startswith("10 s: "), done.stdout  # a 12 s run tells its progress once


@pytest.mark.timeout(90)
def test_the_locustfile_runs_on_its_own_as_a_new_locust_user_starts_it(tmp_path: Path) -> None:
    """``locust -f loadtest/locustfile.py`` with no --redis-url, --db or --host starts a
    server, a database and the web app itself, and stops them when Locust exits."""
    summary = tmp_path / "summary.json"
    command = [sys.executable, "-m", "locust", "-f", "loadtest/locustfile.py", "--headless", "-u", "30", "-r", "30",
               "-t", "8s", "--processes", "2", *master_port(), "--summary", str(summary)]  # fmt: skip
    environment = {key: value for key, value in os.environ.items() if key not in ("STAMPEDE_REDIS_URL", "LOCUST_HOST")}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=85, env=environment)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    started = [line for line in done.stdout.splitlines() if line.startswith("started ")]
    assert [line.split(" at ")[0] for line in started] == [
        "started a throwaway server", "started a shop database", "started the web app"
    ]  # fmt: skip
    figures = json.loads(summary.read_text())
    assert figures["queries"] > 0 and figures["max_queries_per_window"] == 1
    database = Path(started[1].split(" at ")[1])
    assert not database.parent.exists()  # removed on exit, and the server and web app stopped with it
    for line in (started[0], started[2]):
        port = urllib.parse.urlparse(line.split(" at ")[1].split(" ")[0]).port
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_the_fault_figures_script_runs_a_scenario_and_prints_its_row() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "loadtest" / "fault_figures.py"), "--rounds", "1", "-k", "policy_raise"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    row = [line for line in done.stdout.splitlines() if line.startswith('| Redis stopped, on_backend_error="raise"')]
    assert len(row) == 1 and "BackendUnavailable" in row[0], done.stdout


def test_the_serializer_benchmark_prints_both_paths_of_both_values() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "loadtest" / "bench_serializers.py"), "--quick"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if "hit (loads)" in line or "load (dumps+back)" in line]
    assert len(rows) == 4, done.stdout


@pytest.mark.timeout(180)
@pytest.mark.timing
def test_the_freshness_benchmark_short_form_serves_hot_keys_without_a_wait_or_an_error() -> None:
    """``loadtest/bench_freshness.py --quick``: the expiry storm and the outage, as CI can
    afford them. The figures are the script's; this checks the properties that hold
    at any size: one load per window with freshness on, no error to a caller in the
    outage, the loader tried about once per key per second while down, and the server
    commands a warm hit costs."""
    figures = short_form("bench_freshness.py", timeout=240)
    rows = figures["figures"]
    fresh, outage = rows["stampede, swr + early"], rows["stampede, + stale_if_error, outage"]
    per_hit = {name: round(count, 2) for name, count in figures["hit cost"]["commands per hit"].items()}
    assert per_hit == {"plain": 1.0, "fresh": 2.0, "fresh + stale_if_error": 2.0}  # GET, and PTTL
    assert fresh["max per window"] == 1 and fresh["errors"] == 0
    assert fresh["p99"] < 40  # no call waited for a 50 ms load
    assert outage["errors"] == 0 and outage["max per window"] == 1
    assert outage["attempts while down"] <= 10 * (outage["outage s"] + 1)  # 10 keys, one try a second each
    assert outage["keys not reloaded"] == 0 and outage["recovery s"] < 1.0 + 0.5


@pytest.mark.timeout(120)
@pytest.mark.timing
def test_the_near_cache_benchmark_short_form() -> None:
    """``loadtest/bench_near.py --quick``: near hits, invalidations waiting for holders,
    the lease, as CI can afford them. The figures are the script's; this checks what
    holds on any machine: near hits far cheaper than a round trip, invalidations that
    wait for acknowledgements and not for leases, and a lease that ends by itself."""
    figures = short_form("bench_near.py", timeout=110)
    assert figures["hit_path"]["near"]["ratio"] > 5 and figures["hit_path"]["near shared"]["ratio"] > 5
    assert figures["invalidate"]["1"]["median_ms"] < 50  # acknowledged: the lease is 100 ms
    assert figures["lease"]["max_ms"] <= 100 + 20  # a stalled stream stops copies within its lease


@pytest.mark.timeout(120)
@pytest.mark.timing
def test_the_tags_benchmark_short_form() -> None:
    """``loadtest/bench_tags.py --quick``: hits with tags beside a tagless one, tag
    invalidations, bookkeeping after short-lived writes. What holds on any machine: every
    variant ran, hits in the tagless one's league (three rounds are too few for 5%), an
    invalidation of expired entries cheaper than of live ones, and nothing left of the
    short-lived writes once expired."""
    figures = short_form("bench_tags.py", timeout=110)["figures"]
    assert all(figures["hits"]["versus_tagless"][name] > 0.7 for name in ("1 tag", "3 tags"))
    thousand = figures["invalidate_tag"]["1000"]
    assert thousand["after_expiry_seconds"] < thousand["seconds"] < 1
    assert figures["memory"]["keys_left"] == 0 and figures["memory"]["catalog_members"] == 0


@pytest.mark.timeout(120)
@pytest.mark.timing
def test_the_versions_benchmark_short_form() -> None:
    """``loadtest/bench_versions.py --quick``: what reaching the other side's entries costs
    in the deploy that adopts ``version=``. What holds on any machine: every figure ran,
    and an entry no versioned loader marked is set and invalidated in the league of an
    unversioned loader before versions reached it (one script each: the mark is read in
    it), while a marked one pays the entry tag's invalidation."""
    figures = short_form("bench_versions.py", timeout=110)
    assert all(value > 0 for value in figures["us_per_call"].values())
    ratios = figures["ratios"]
    assert ratios["unmarked set / raw SET"] < 4 and ratios["unmarked invalidate / raw DEL"] < 4
    assert ratios["marked invalidate / unmarked invalidate"] > 1


@pytest.mark.timeout(120)
@pytest.mark.timing
def test_the_values_benchmark_short_form() -> None:
    """``loadtest/bench_values.py --quick``: compression of a category map and a 1 MB
    value, and set and peek beside a raw SET and GET. What holds on any machine: each
    compression stores the map in under half its bytes and the 1 MB value in under a
    tenth (it repeats words), every variant ran, and a set is one round trip (a tagged
    one two: its tags' clock first)."""
    figures = short_form("bench_values.py", timeout=110)
    for kind, row in figures["compression"]["200-entry map"].items():
        assert row["size ratio"] < (1.01 if kind == "none" else 0.5), kind
    for kind, row in figures["compression"]["1 MB value"].items():
        assert row["size ratio"] < (1.01 if kind == "none" else 0.1), kind
    assert all(row["calls/s"] > 0 for row in figures["controls"].values())
    controls = figures["controls"]
    assert controls["loader.set"]["round trips"] == 1 and controls["tagged set"]["round trips"] == 2


@pytest.mark.timeout(120)
@pytest.mark.timing
def test_the_metrics_benchmark_short_form() -> None:
    """``loadtest/bench_metrics.py --quick``: warm hits with counters only, Prometheus and
    OpenTelemetry, beside raw GET + loads. The figures are the script's (three rounds are
    too few to hold them to 5%); this checks that every variant ran and stayed in the
    same league as the counters-only layer."""
    figures = short_form("bench_metrics.py", timeout=110)
    assert set(figures) == {"raw GET + loads", "counters only", "prometheus", "opentelemetry", "report_us"}
    assert all(figures[name]["vs_counters"] > 0.5 for name in ("prometheus", "opentelemetry"))
    assert all(0 < cost < 50 for cost in figures["report_us"].values())  # microseconds per report


@pytest.mark.timeout(120)
def test_the_lock_services_benchmark_short_form() -> None:
    """``loadtest/bench_lock_services.py --quick``: every service the machine can run,
    each row measured, every stampede loaded once, a killed holder taken over."""
    table = short_form("bench_lock_services.py", timeout=110)
    taken = table.pop("takeover_s")
    assert {"Redis", "Redlock (5)"} <= set(table)
    assert 0.5 < taken["Redis (lease 1 s)"] < 3  # by the lease, not by wait_timeout
    for figures in table.values():
        assert figures["acquire_release_us"] > 0 and figures["handoff_ms"] > 0
        assert figures.get("loads", [1]) == [1]
        assert figures.get("storm_ms", 1) > 0 and len(figures.get("loaded_twice", [0])) == 1  # one round each


@pytest.mark.timeout(120)
@pytest.mark.timing
def test_the_async_benchmark_short_form_loads_once_per_round() -> None:
    """``loadtest/bench_async.py --quick``: a thousand coroutines on one cold key, and
    warm async hits beside raw redis.asyncio GET + loads. The figures are the script's;
    this checks what holds on any machine: one load for the stampede (more without
    protection), every caller served within the wait, and hits in the same league."""
    figures = short_form("bench_async.py", timeout=110)
    assert figures["cold"]["stampede"]["loads"] == [1] and figures["cold"]["off"]["loads"][0] > 1
    assert 0 < figures["cold"]["stampede"]["over_loader_ms"][0] < 5000  # within the default wait_timeout
    assert figures["hit_ratio"] > 0.5


@pytest.mark.timeout(120)
@pytest.mark.timing
def test_the_hit_path_benchmark_short_form_times_every_part() -> None:
    """``loadtest/bench_hit_path.py --quick``: each part of a warm hit timed alone, and
    the whole hit beside a bare GET + loads. Each part is measured, and stampede's own
    (key, singleflight, breaker) cost less than the round trip they wrap."""
    figures = short_form("bench_hit_path.py", timeout=110)
    parts = figures["parts_us"]
    assert set(parts) == {"key", "singleflight", "breaker", "pool", "round trip", "client", "decode", "counter"}
    assert all(cost > 0 for name, cost in parts.items() if name != "client")  # client is a difference
    assert parts["round trip"] > parts["key"] + parts["singleflight"] + parts["breaker"]
    assert figures["ratio"] > 0.5 and figures["whole_us"] > 0 and figures["bare_us"] > 0


@pytest.mark.timeout(120)
@pytest.mark.timing
def test_the_tracing_benchmark_short_form_times_a_hit_under_every_mode() -> None:
    """``loadtest/bench_hit_path.py --tracing --quick``: a hit and a near hit under each
    way tracing may be left, each in a process of its own. What holds on any machine: every
    mode measured, and recording spans costs a near hit more than tracing off does."""
    figures = short_form("bench_hit_path.py", 110, "--tracing")
    assert set(figures) == {"off", "noop", "sampled-out", "recording"}
    assert all(row["hit_us"] > 0 and row["near_us"] > 0 for row in figures.values())
    assert figures["off"]["hit_ratio"] == figures["off"]["near_ratio"] == 1.0
    assert figures["recording"]["near_ratio"] > 1.0


@pytest.mark.timeout(120)
@pytest.mark.timing
def test_the_verification_benchmark_short_form_verifies_about_the_sample_rate() -> None:
    """``loadtest/bench_hit_path.py --verify --quick``: hits with ``verify_sample`` at 0.001
    beside hits without. What holds on any machine: both measured, and the loader called
    by verifications about the sample rate per hit at most (each hit is sampled with that
    chance: five standard deviations of slack, so that the test fails only if it is not)."""
    figures = short_form("bench_hit_path.py", 110, "--verify")
    assert set(figures) == {"hit", "near hit"}
    for row in figures.values():
        assert row["off_us"] > 0 and row["on_us"] > 0
        expected = 0.001 * row["hits"]
        assert row["verifications"] <= expected + 5 * expected**0.5 + 1, row


@pytest.mark.timeout(120)
@pytest.mark.timing  # alone: eight threads and their verifications busy both cores
def test_the_consistency_benchmark_short_form_agrees_with_the_history_checker() -> None:
    """``loadtest/bench_consistency.py --quick``: with a correct writer, no mismatch and no
    violation; with a broken one, at each of three sample rates and the default settings,
    the verifications' mismatch rate agrees with the stale rate the history checker finds
    in the same run: within 10%, or within the sampling spread of the verifications run
    where those are too few to tell 10% (the script exits 1 otherwise)."""
    figures = short_form("bench_consistency.py", 110)
    correct, broken = figures["correct"], figures["broken"]
    assert correct["checks"]["match"] > 1000 and correct["checks"]["mismatch"] == 0
    assert correct["stale_reads"] == 0 and correct["other_violations"] == {}
    assert [run["sample"] for run in broken] == [0.001, 0.01, 0.05]
    for run in broken:
        assert run["stale_reads"] > 100 and abs(run["ratio"] - 1) <= run["tolerance"], run
    busiest = broken[-1]  # 0.05: the rate where a mismatch holding a place skewed the share 1.18x
    assert busiest["checks"]["mismatch"] > 100 and busiest["verifications"] > 200
    assert abs(busiest["ratio"] - 1) <= busiest["tolerance"] <= 0.25


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["hit", "cold"])
def test_the_profile_workloads_run_and_share_their_time_out_by_package(path: str) -> None:
    """``loadtest/profile_paths.py <path> --quick``: the workload runs under cProfile and
    its own time is shared out by package, stampede's and redis-py's among them."""
    shares = short_form("profile_paths.py", 110, path)["shares"]
    assert shares["stampede"] > 0 and shares["redis"] > 0
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)


@pytest.mark.timeout(120)
def test_the_history_checks_short_form_finds_no_violation() -> None:
    """``loadtest/check_histories.py --quick``: every profile ran its operations, with
    loads, and no violation (the script exits 1 on one, which ``short_form`` fails)."""
    figures = short_form("check_histories.py", 110)
    assert len(figures) == 6
    assert all(row["operations"] == 2000 and row["loads"] > 0 and row["violations"] == {} for row in figures.values())


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(120)
def test_the_http_benchmark_collapses_the_cold_burst_in_its_short_form(tmp_path: Path) -> None:
    """``loadtest/bench_http.py --quick``: one view call for a cold burst, against more
    uncached, and the picture (``--plot``) drawn."""
    figures = short_form("bench_http.py", 110, "--plot", str(tmp_path / "http.png"))
    assert is_png(tmp_path / "http.png")
    pages = figures["pages"]
    assert pages["stampede"]["cold burst"]["view calls"] == 1
    assert pages["uncached"]["cold burst"]["view calls"] > 1
    assert all(row["cold burst"]["statuses"] == [200] for row in pages.values())
    django = figures["django get_or_set"]
    if django:  # django-redis installed (the dev extra installs it)
        assert django["stampede"]["report calls"] == 1


@pytest.mark.timeout(180)
def test_the_many_keys_benchmark_short_form_loads_each_id_once(tmp_path: Path) -> None:
    """``loadtest/bench_many.py --quick`` on one server: overlapping cold pages in 4
    processes load each id once with the many-key loader (where no protection loads the
    busiest ids many times), a warm page is one MGET, and the picture is drawn."""
    figures = short_form("bench_many.py", 170, "--no-cluster", "--plot", str(tmp_path / "many.png"))
    cold = figures["cold"]
    many, bare = cold["stampede many"], cold["no protection"]
    assert many["max_per_id"] == 1 and many["id_loads"] == many["ids"] and many["wrong"] == 0
    assert bare["max_per_id"] > 1
    assert figures["warm"]["commands"] == {"mget": 1}
    assert figures["half_in_flight"]["second"] == [25]
    assert is_png(tmp_path / "many.png")
