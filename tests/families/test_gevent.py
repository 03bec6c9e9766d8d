"""stampede under gevent monkey-patching (how Locust runs it): the singleflight, the lease
watchdog and the pub/sub subscriber all run as greenlets. Each scenario runs in a
subprocess (tests/gevent_worker.py), because patching must precede every other import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gevent")

WORKER = Path(__file__).parent.parent.joinpath("gevent_worker.py")


def scenario(redis_url: str, name: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, str(WORKER), redis_url, name], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert result["threading_patched"]
    return result


def test_500_greenlets_on_a_cold_key_make_one_load(redis_url: str, redis_client: Any) -> None:
    result = scenario(redis_url, "burst")
    assert result["loads"] == 1
    assert result["callers"] == 500 and result["distinct"] == 1
    assert result["collapsed"] == 499


def test_the_watchdog_greenlet_renews_the_lease_of_a_load_five_leases_long(redis_url: str, redis_client: Any) -> None:
    result = scenario(redis_url, "watchdog")
    assert result["loads"] == 1, "the other layer took over: the lease was not renewed"
    assert result["values"] == [{"key": "k"}, {"key": "k"}]
    # Sampled for 1.3 s of a 0.3 s lease: never gone, never longer than one lease.
    assert len(result["lock_ttls_ms"]) >= 8
    assert all(0 < ttl <= result["lease_ms"] for ttl in result["lock_ttls_ms"]), result["lock_ttls_ms"]
    assert result["locks_left"] == []
    assert {"stampede-watchdog", "stampede-subscriber"} <= set(result["threads_while_loading"])


def test_the_subscriber_greenlet_wakes_a_waiter_of_another_layer_at_once(redis_url: str, redis_client: Any) -> None:
    result = scenario(redis_url, "wake-up")
    assert result["values"] == [{"key": "k"}, {"key": "k"}]
    assert result["waiter_stats"]["lock_waits"] == 1 and result["waiter_stats"]["loads"] == 0
    # Its re-check interval and the lease are 20 s: only the message can wake it this soon.
    assert result["lag"] < 1.0, result
