"""Across OS processes: one load per key, and takeover when the holder is SIGKILLed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

WORKER = str(Path(__file__).parent.parent.joinpath("worker.py"))


class Workers:
    """Worker processes started by a test; all stopped (by PID) when it ends."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, url: str, *args: str, script: str = WORKER) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, script, "--url", url, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.processes.append(process)
        return process

    @staticmethod
    def expect(process: subprocess.Popen[str], line: str) -> None:
        assert process.stdout is not None
        got = process.stdout.readline().strip()
        assert got == line, f"worker said {got!r}, expected {line!r}"

    @staticmethod
    def go(processes: list[subprocess.Popen[str]]) -> None:
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()

    @staticmethod
    def result(process: subprocess.Popen[str], timeout: float = 30) -> dict[str, Any]:
        out, _ = process.communicate(timeout=timeout)
        assert process.returncode == 0, f"worker exited with {process.returncode}"
        return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(5)
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()


def run_stampede(
    url: str, processes: int, *args: str, script: str = WORKER, timeout: float = 30
) -> list[dict[str, Any]]:
    """Start ``processes`` workers, let them go at once, and collect what each saw."""
    workers = Workers()
    try:
        started = [workers.start(url, *args, script=script) for _ in range(processes)]
        for process in started:
            workers.expect(process, "ready")
        workers.go(started)
        return [workers.result(process, timeout=timeout) for process in started]
    finally:
        workers.stop_all()


def test_four_processes_of_sixteen_threads_load_one_cold_key_once(redis_url: str, redis_client: redis.Redis) -> None:
    results = run_stampede(redis_url, 4, "--threads", "16", "--keys", "1", "--delay", "0.2")

    assert int(redis_client.get("calls:0") or 0) == 1
    assert sum(r["calls"] for r in results) == 64
    assert all(r["wrong"] == [] for r in results)


def test_two_hundred_cold_keys_are_loaded_two_hundred_times(redis_url: str, redis_client: redis.Redis) -> None:
    results = run_stampede(redis_url, 4, "--threads", "16", "--keys", "200", "--delay", "0.01")

    calls = [int(redis_client.get(f"calls:{key}") or 0) for key in range(200)]
    assert calls == [1] * 200
    assert sum(r["calls"] for r in results) == 4 * 16 * 200
    assert all(r["wrong"] == [] for r in results)


def test_a_killed_holder_is_taken_over_by_a_waiter_in_another_process(
    redis_url: str, redis_client: redis.Redis, figures: Callable[..., None]
) -> None:
    workers = Workers()
    try:
        holder = workers.start(redis_url, "--threads", "1", "--hang", "--lock-ttl", "1")
        workers.expect(holder, "ready")
        workers.go([holder])
        workers.expect(holder, "loading")  # it holds the lock, its watchdog renews it

        waiters = [workers.start(redis_url, "--threads", "4", "--lock-ttl", "1", "--wait-timeout", "10")
                   for _ in range(2)]  # fmt: skip
        for waiter in waiters:
            workers.expect(waiter, "ready")
        workers.go(waiters)
        deadline = time.monotonic() + 10
        while redis_client.pubsub_numsub("proc:{item:0}:notify")[0][1] < 2:
            assert time.monotonic() < deadline, "waiters never subscribed"
            time.sleep(0.01)
        holder.kill()  # SIGKILL mid-load: no release, no write
        killed_at = time.monotonic()
        results = [workers.result(waiter, timeout=15) for waiter in waiters]
        finished = time.monotonic() - killed_at
    finally:
        workers.stop_all()

    figures("lock holder SIGKILLed (lease 1 s), 2 processes x 4 threads waiting", worst=finished, deadline=10,
            loads=int(redis_client.get("calls:0") or 0), bound=2)  # fmt: skip
    assert int(redis_client.get("calls:0") or 0) == 2  # the dead holder's and one takeover
    assert all(r["wrong"] == [] and r["calls"] == 4 for r in results)
    assert sum(r["stats"]["takeovers"] for r in results) == 1
    assert finished < 10  # nobody waited out wait_timeout
    assert max(r["max_latency"] for r in results) < 10
    assert not redis_client.exists("proc:{item:0}:lock")


def test_a_child_forked_mid_load_does_not_wait_for_its_parents_flights(redis_url: str, redis_client: Any) -> None:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).parent.parent.joinpath("fork_worker.py")), redis_url],
        capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    child, calls = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert child["child_values"] == ["child", "during"]
    # The parent's in-flight "during" is not awaited in memory (wait_timeout 20 s): the
    # child's callers read the value the parent wrote, or wait for it through Redis.
    assert child["child_wait_timeouts"] == 0 and child["child_seconds"] < 5
    assert calls == {"calls:warm": 1, "calls:during": 1, "calls:child": 1}
