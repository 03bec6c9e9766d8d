"""stampede under gevent monkey-patching, as Locust runs it: a script the gevent tests
run in a subprocess (patching must come before every other import, and would change the
test runner itself).

    python tests/gevent_worker.py REDIS_URL SCENARIO

Prints one JSON line with what the scenario saw; the test asserts on it. Scenarios:

burst     500 greenlets call one cold key of a 100 ms loader.
watchdog  the loader runs 5 leases long in one layer while a second layer (another
          "process": its own flight table, subscriber and watchdog) waits on the key;
          a third greenlet samples the lock key's time to live meanwhile.
wake-up   a second layer waits on a key whose holder writes after 300 ms, with the
          re-check interval and the lease far longer than that: only the pub/sub
          message can wake it in time.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
import gevent.event  # noqa: E402
import redis  # noqa: E402

from stampede import Stampede  # noqa: E402


def burst(url: str) -> dict[str, Any]:
    layer = Stampede.from_url(url, namespace="gevent")
    calls = []

    @layer.cached_loader("burst:{key}")
    def load(key: str) -> dict[str, str]:
        calls.append(key)
        time.sleep(0.1)  # patched: yields to the other greenlets
        return {"key": key}

    greenlets = [gevent.spawn(load, "cold") for _ in range(500)]
    gevent.joinall(greenlets, timeout=30, raise_error=True)
    values = [greenlet.value for greenlet in greenlets]
    stats = layer.stats()
    layer.close()
    return {"loads": len(calls), "callers": len(values), "distinct": len({json.dumps(v) for v in values}),
            "collapsed": stats["collapsed"]}  # fmt: skip


def two_layers(url: str, **settings: Any) -> tuple[Stampede, Stampede]:
    return (
        Stampede.from_url(url, namespace="gevent", **settings),
        Stampede.from_url(url, namespace="gevent", **settings),
    )


def watchdog(url: str) -> dict[str, Any]:
    lease, loader_seconds = 0.3, 1.5
    first, second = two_layers(url, lock_ttl=lease, wait_timeout=20)
    calls: list[str] = []
    loading = gevent.event.Event()

    def slow(key: str) -> dict[str, str]:
        calls.append(key)
        loading.set()
        time.sleep(loader_seconds)
        return {"key": key}

    load_first = first.cached_loader("watched:{key}")(slow)
    load_second = second.cached_loader("watched:{key}")(slow)
    client = redis.Redis.from_url(url, socket_timeout=5)
    lock_key = load_first.key("k") + ":lock"

    leader = gevent.spawn(load_first, "k")
    loading.wait(10)
    waiter = gevent.spawn(load_second, "k")
    ttls = []
    running: set[str] = set()
    deadline = time.monotonic() + loader_seconds - 0.2
    while time.monotonic() < deadline:  # the lock's remaining lease, every 100 ms
        ttls.append(client.pttl(lock_key))
        running.update(thread.name for thread in threading.enumerate())
        time.sleep(0.1)
    gevent.joinall([leader, waiter], timeout=30, raise_error=True)
    left = [key.decode() for key in client.keys("gevent*") if b"lock" in key]
    result = {"loads": len(calls), "values": [leader.value, waiter.value], "lock_ttls_ms": ttls,
              "lease_ms": lease * 1000, "locks_left": left,
              "threads_while_loading": sorted(running)}  # fmt: skip
    first.close()
    second.close()
    client.close()
    return result


def wake_up(url: str) -> dict[str, Any]:
    first, second = two_layers(url, lock_ttl=20, recheck_interval=20, wait_timeout=30)
    loading = gevent.event.Event()
    finished: dict[str, float] = {}

    def timed(name: str, load: Callable[[str], Any]) -> Any:
        value = load("k")
        finished[name] = time.monotonic()
        return value

    def slow(key: str) -> dict[str, str]:
        loading.set()
        time.sleep(0.3)
        return {"key": key}

    load_first = first.cached_loader("woken:{key}")(slow)
    load_second = second.cached_loader("woken:{key}")(slow)
    leader = gevent.spawn(timed, "leader", load_first)
    loading.wait(10)
    waiter = gevent.spawn(timed, "waiter", load_second)
    gevent.joinall([leader, waiter], timeout=30, raise_error=True)
    result = {"values": [leader.value, waiter.value], "lag": finished["waiter"] - finished["leader"],
              "waiter_stats": second.stats()}  # fmt: skip
    first.close()
    second.close()
    return result


SCENARIOS = {"burst": burst, "watchdog": watchdog, "wake-up": wake_up}


def main() -> None:
    url, scenario = sys.argv[1], sys.argv[2]
    result = SCENARIOS[scenario](url)
    result["threading_patched"] = monkey.is_module_patched("threading")  # so threads are greenlets
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
