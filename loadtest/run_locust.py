"""The Locust load test in one command: protection off, then on, side by side.

    python loadtest/run_locust.py            # 200 users, 4 processes, 60 s per run, TTL 3 s
    python loadtest/run_locust.py --quick    # 40 users, 2 processes, 12 s, protection on only (CI)
    python loadtest/run_locust.py --redis redis://127.0.0.1:6379/0 --protection on

For each run it makes a fresh shop database (examples/shop.py, every query logged),
starts the web app (examples/web_app.py) on a free 127.0.0.1 port over the same
database and Redis, and runs loadtest/locustfile.py headless with ``--processes``.
The Redis server is a throwaway one unless ``--redis`` is given (then only the keys
of these runs, "shop:*" and "off:*", are deleted before each run).

It prints, per run: requests, requests/s, p50/p99 latency (Locust's), database queries
and queries per key per expiry window, and the ratio of database queries off/on. In
``--out`` (default loadtest/results/) it leaves Locust's CSV and HTML reports, each
run's figures as JSON, db_queries.png: database queries per second, off vs on, and
metrics.png: the web app's stampede metrics during the run with protection on, scraped
from its /metrics every second (metrics_plot.py).
Exits non-zero if the run with protection on queried any key twice in one window, or
if Locust failed.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "examples"))

from expiry_windows import plot, queries_per_second  # noqa: E402
from metrics_plot import MetricsSampler, plot_metrics  # noqa: E402
from shop import ShopDatabase  # noqa: E402
from standalone import WebApp  # noqa: E402

from stampede.testing import free_port, server_url  # noqa: E402


def forget_previous_runs(url: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    for pattern in ("shop:*", "off:*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    client.close()


def master_port() -> list[str]:
    """Locust's options for a master port of this run's own: with ``--processes`` its
    workers talk to the master over 5557 by default, which another run on the machine
    may hold (the suite runs the load test and the locustfile at once)."""
    port = str(free_port())
    return ["--master-bind-port", port, "--master-port", port]


PROGRESS_EVERY = 10.0  # seconds between two lines of a run's progress


def run(protection: str, url: str, options: argparse.Namespace) -> dict[str, Any]:
    """One Locust run; its figures (from the query log and Locust's CSV) and exit code."""
    out: Path = options.out
    database = ShopDatabase.create(out / f"shop-{protection}.sqlite")
    forget_previous_runs(url)
    app = WebApp(url, database.path, protection, options.ttl, out / f"web_app-{protection}.log")
    try:
        app.wait_ready()
        command = [
            sys.executable, "-m", "locust", "-f", str(HERE / "locustfile.py"), "--headless", *master_port(),
            "--processes", str(options.processes), "-u", str(options.users), "-r", str(options.spawn_rate),
            "-t", f"{options.run_time}s", "--stop-timeout", "5", "--host", app.base, "--only-summary",
            "--csv", str(out / protection), "--csv-full-history", "--html", str(out / f"{protection}.html"),
            "--redis-url", url, "--db", str(database.path), "--ttl", str(options.ttl),
            "--protection", protection, "--summary", str(out / f"{protection}.json"),
        ]  # fmt: skip
        print(f"protection {protection}: {options.users} users, {options.processes} processes, "
              f"{options.run_time} s ...", flush=True)  # fmt: skip
        started = time.time()
        sampler = MetricsSampler(app.base + "/metrics")
        try:
            returncode = run_telling_progress(command, out / f"locust-{protection}.log", database, started, options)
        finally:
            samples = sampler.stop()
    finally:
        app.stop()
    figures: dict[str, Any] = {"locust_exit_code": returncode, "metrics": samples}
    summary = out / f"{protection}.json"
    if summary.exists():
        figures.update(json.loads(summary.read_text()))
    figures.update(locust_figures(out / f"{protection}_stats.csv"))
    figures["per_second"] = queries_per_second(database.queries(), started)
    return figures


def run_telling_progress(
    command: list[str], log: Path, database: ShopDatabase, started: float, options: argparse.Namespace
) -> int:
    """Locust, its output in ``log``, and a line every ``PROGRESS_EVERY`` seconds while it
    runs (the database's queries so far), so that a minute's run does not look hung.
    Its exit code; killed (by its PID) if it runs two minutes past its run time."""
    deadline = started + options.run_time + 120
    with (
        log.open("w") as output,
        subprocess.Popen(command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT) as locust,
    ):
        while True:
            try:
                return locust.wait(timeout=PROGRESS_EVERY)
            except subprocess.TimeoutExpired:
                elapsed = time.time() - started
                if time.time() > deadline:
                    locust.kill()
                    locust.wait()
                    raise
                print(f"  {elapsed:4.0f} s: {len(database.queries())} database queries so far", flush=True)


def locust_figures(stats_csv: Path) -> dict[str, Any]:
    """Requests, requests/s and the p50/p99 latency of all requests, from Locust's CSV."""
    if not stats_csv.exists():
        return {}
    with stats_csv.open() as file:
        for row in csv.DictReader(file):
            if row["Name"] == "Aggregated":
                return {
                    "requests": int(row["Request Count"]),
                    "failures": int(row["Failure Count"]),
                    "requests_per_s": round(float(row["Requests/s"]), 1),
                    "p50_ms": float(row["50%"]),
                    "p99_ms": float(row["99%"]),
                }
    return {}


def report(results: dict[str, dict[str, Any]], options: argparse.Namespace) -> None:
    columns = [
        ("requests", "requests"), ("req/s", "requests_per_s"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"),
        ("failures", "failures"), ("db queries", "queries"), ("keys", "keys"), ("windows", "windows"),
        ("max q/window", "max_queries_per_window"), ("mean q/window", "mean_queries_per_window"),
        ("windows > 1 q", "windows_with_more_than_one_query"),
    ]  # fmt: skip
    print()
    print(f"{'protection':<11}" + "".join(f"{title:>14}" for title, _ in columns))
    for name, figures in results.items():
        print(f"{name:<11}" + "".join(f"{figures.get(field, '-')!s:>14}" for _, field in columns))
    if "on" in results and "off" in results and results["on"].get("queries"):
        off, on = results["off"], results["on"]
        print(f"\ndatabase queries, off / on: {off['queries'] / on['queries']:.1f}x")
        hottest = next(iter(off["queries_by_key"]), None)
        if hottest is not None:
            print(f"the most queried key, {hottest!r}: {off['queries_by_key'][hottest]} queries off, "
                  f"{on['queries_by_key'].get(hottest, 0)} on")  # fmt: skip
    if options.plot:
        path = options.out / "db_queries.png"
        plot({name: figures["per_second"] for name, figures in results.items()}, options.ttl, str(path))
        print(f"plot: {path}")
        if "on" in results and len(results["on"]["metrics"]) > 2:
            path = options.out / "metrics.png"
            title = (f"The web app's stampede metrics under Locust ({options.users} users, "
                     f"{options.processes} processes, TTL {options.ttl:g} s)")  # fmt: skip
            plot_metrics(results["on"]["metrics"], title, str(path))
            print(f"plot: {path}")
    print(f"reports: {options.out}/<off|on>.html, <off|on>_stats.csv, <off|on>.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: start a throwaway server")
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--run-time", type=int, default=60, help="seconds per run")
    parser.add_argument("--spawn-rate", type=float, default=100)
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--protection", choices=("both", "on", "off"), default="both")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--no-plot", dest="plot", action="store_false")
    parser.add_argument("--quick", action="store_true", help="the short form CI runs: protection on only")
    options = parser.parse_args()
    if options.quick:
        options.users, options.processes, options.run_time, options.ttl = 40, 2, 12, 1.0
        options.protection, options.plot = "on", False
    options.out.mkdir(parents=True, exist_ok=True)

    modes = ["off", "on"] if options.protection == "both" else [options.protection]
    with server_url(options.redis) as url:
        results = {mode: run(mode, url, options) for mode in modes}
    report(results, options)
    (options.out / "figures.json").write_text(json.dumps(
        {mode: {k: v for k, v in figures.items() if k not in ("per_second", "metrics")}
         for mode, figures in results.items()},
        indent=2))  # fmt: skip
    failed = [mode for mode, figures in results.items() if figures["locust_exit_code"] != 0]
    if "on" in results and results["on"].get("max_queries_per_window", 2) > 1:
        failed.append("on: a key was queried more than once in one expiry window")
    if failed:
        print(f"FAILED: {failed} (see {options.out}/locust-*.log)")
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
