"""The HTTP Working Group's cache tests (the suite behind cache-tests.fyi) against
``stampede.http`` as a reverse proxy, beside the reverse proxies whose results the suite
publishes.

    python loadtest/cache_tests/run.py                 # both middlewares, the table
    python loadtest/cache_tests/run.py --id freshness-max-age   # one test, verbosely
    python loadtest/cache_tests/run.py --middleware asgi --json results.json

It needs Node.js and npm: the suite (npm package ``http-cache-tests``, pinned below) is
installed once into ``$STAMPEDE_CACHE_TESTS_DIR`` (default: ``~/.cache/stampede``). It
starts a Valkey/Redis server, the suite's origin server and the proxy (``forward.py``:
uvicorn for ASGI, gunicorn with two workers for WSGI) on free 127.0.0.1 ports, runs the
suite's CLI against the proxy, and stops what it started by PID. Results are classified
by the suite's own ``determineTestResult`` (``summary.mjs``)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from stampede.testing import RedisServer
from stampede.testing.servers import free_port

HERE = Path(__file__).resolve().parent
SUITE_VERSION = "0.4.5"
PEERS = ("nginx", "Squid", "ATS", "httpd", "Varnish", "nuster")
BEST_REQUIRED = ("Varnish", "httpd", "ATS")  # no required test they pass may fail here
DEVIATIONS = {
    "304-etag-update-response-Set-Cookie": "a Set-Cookie is one client's: a response carrying one, or a 304 adding "
    "one, is never kept nor shared (the 304 goes to its own request only)",
    "other-date-update": "WSGI only: gunicorn sends a Date of its own before the application's",
}
"""Required tests that Varnish, httpd or ATS pass and stampede fails on purpose, and why."""


def suite_dir() -> Path:
    """The suite, installed with npm once (the pinned version)."""
    root = Path(os.environ.get("STAMPEDE_CACHE_TESTS_DIR") or Path.home() / ".cache" / "stampede")
    package = root / f"http-cache-tests-{SUITE_VERSION}"
    installed = package / "node_modules" / "http-cache-tests"
    if not (installed / "cli.mjs").exists():
        package.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", f"http-cache-tests@{SUITE_VERSION}"],
                       cwd=package, check=True, timeout=600)  # fmt: skip
    return installed


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listened on port {port} within {timeout} s")


@contextmanager
def started(command: list[str], port: int, env: dict[str, str], cwd: Path | None = None) -> Iterator[None]:
    """A process of ours, in a session of its own, ended by its PID (and its group). Its
    stderr goes to a file (a pipe nobody reads would fill and stop it); a traceback in it
    is shown when it ends."""
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=errors,
                                   start_new_session=True)  # fmt: skip
        try:
            wait_for_port(port, process)
            yield
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(10)
            errors.seek(0)
            text = errors.read().decode(errors="replace")
            if "Traceback" in text:
                sys.stderr.write(f"{command[:3]} wrote:\n{text[-6000:]}\n")


def proxy_command(middleware: str, port: int) -> list[str]:
    if middleware == "asgi":
        return [sys.executable, "-m", "uvicorn", "forward:asgi_app", "--host", "127.0.0.1", "--port", str(port),
                "--no-date-header", "--no-server-header", "--no-access-log", "--log-level", "warning"]  # fmt: skip
    return [sys.executable, "-m", "gunicorn", "forward:wsgi_app", "--bind", f"127.0.0.1:{port}", "--workers", "2",
            "--threads", "8", "--log-level", "warning"]  # fmt: skip


def run_suite(middleware: str, test_id: str = "") -> dict[str, object] | str:
    """The suite's results for one middleware (or, with ``test_id``, its verbose dump)."""
    suite = suite_dir()
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        redis = stack.enter_context(RedisServer())
        origin_port, proxy_port = free_port(), free_port()
        node_env = {**os.environ, "npm_config_port": str(origin_port), "npm_config_protocol": "http",
                    "npm_config_pidfile": str(Path(scratch) / "origin.pid")}  # fmt: skip
        stack.enter_context(started(["node", "server/server.mjs"], origin_port, node_env, cwd=suite))
        proxy_env = {**os.environ, "CACHE_TESTS_ORIGIN": f"http://127.0.0.1:{origin_port}",
                     "CACHE_TESTS_REDIS": redis.url, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}  # fmt: skip
        stack.enter_context(started(proxy_command(middleware, proxy_port), proxy_port, proxy_env, cwd=HERE))
        cli_env = {
            **os.environ,
            "npm_config_base": f"http://127.0.0.1:{proxy_port}",
            "npm_config_id": test_id,
            "npm_package_config_id": "",
        }  # the CLI reads an empty id as "all" only from here
        done = subprocess.run(["node", "--no-warnings", "cli.mjs"], cwd=suite, env=cli_env, capture_output=True,
                              timeout=900, check=True)  # fmt: skip
        output = done.stdout.decode()
        return output if test_id else json.loads(output)


def classify(ours: dict[str, dict[str, object]]) -> dict[str, object]:
    suite = suite_dir()
    with tempfile.TemporaryDirectory() as scratch:
        files = []
        for name, results in ours.items():
            path = Path(scratch) / f"{name}.json"
            path.write_text(json.dumps(results))
            files.append(str(path))
        done = subprocess.run(["node", "--no-warnings", str(HERE / "summary.mjs"), str(suite), *files],
                              capture_output=True, check=True, timeout=120)  # fmt: skip
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def table(summary: dict[str, object], ours: list[str]) -> str:
    caches: dict[str, dict[str, str]] = summary["caches"]  # type: ignore[assignment]
    columns = [*ours, *(name for name in PEERS if name in caches)]
    rows = ["pass", "fail", "optional_fail", "yes", "no", "dependency_fail", "setup_fail", "harness_fail", "retry",
            "untested"]  # fmt: skip
    counts = {name: Counter(caches[name].values()) for name in columns}
    lines = ["| result | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for row in rows:
        lines.append(f"| {row} | " + " | ".join(str(counts[name][row]) for name in columns) + " |")
    return "\n".join(lines)


def regressions(summary: dict[str, object], ours: str) -> list[str]:
    """Required tests ours fails that one of ``BEST_REQUIRED`` passes."""
    caches: dict[str, dict[str, str]] = summary["caches"]  # type: ignore[assignment]
    kinds: dict[str, str] = summary["kinds"]  # type: ignore[assignment]
    return sorted(test for test, kind in kinds.items() if kind == "required" and caches[ours][test] == "fail"
                  and any(caches[peer][test] == "pass" for peer in BEST_REQUIRED))  # fmt: skip


def fewer_passed(summary: dict[str, object], ours: str) -> str | None:
    """Why ``ours`` misses the first half of the goal (more tests passed than any
    published reverse proxy), or None."""
    caches: dict[str, dict[str, str]] = summary["caches"]  # type: ignore[assignment]
    passed = {name: Counter(results.values())["pass"] for name, results in caches.items()}
    best = max(count for name, count in passed.items() if name in PEERS)
    return None if passed[ours] > best else f"{ours} passes {passed[ours]} tests, a published proxy {best}"


def failing_required(summary: dict[str, object], ours: str) -> list[str]:
    """The second half: required tests ``ours`` fails that Varnish, httpd or ATS pass,
    but the deviations on purpose (``DEVIATIONS``)."""
    return [test for test in regressions(summary, ours) if test not in DEVIATIONS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--middleware", choices=["asgi", "wsgi", "both"], default="both")
    parser.add_argument("--id", default="", help="run one test and print what the suite's CLI prints of it")
    parser.add_argument("--json", help="write the raw results of each middleware and their classes to this file")
    parser.add_argument("--failures", action="store_true", help="list the tests each middleware fails")
    options = parser.parse_args()
    if shutil.which("node") is None or shutil.which("npm") is None:
        sys.exit("cache-tests needs Node.js and npm")
    middlewares = ["asgi", "wsgi"] if options.middleware == "both" else [options.middleware]
    if options.id:
        for middleware in middlewares:
            print(f"== {middleware}\n{run_suite(middleware, options.id)}")
        return
    ours = {f"stampede-{middleware}": run_suite(middleware) for middleware in middlewares}
    summary = classify(ours)  # type: ignore[arg-type]
    print(table(summary, list(ours)))
    caches: dict[str, dict[str, str]] = summary["caches"]  # type: ignore[assignment]
    for name in ours:
        worse = regressions(summary, name)
        print(f"\n{name}: {len(worse)} required tests failed that Varnish, httpd or ATS pass: {' '.join(worse)}")
        if options.failures:
            for kind in ("fail", "optional_fail", "dependency_fail", "setup_fail", "harness_fail", "retry"):
                failed = sorted(test for test, result in caches[name].items() if result == kind)
                print(f"  {kind} ({len(failed)}): {' '.join(failed)}")
    if options.json:
        Path(options.json).write_text(json.dumps({"raw": ours, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
