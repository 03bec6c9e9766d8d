"""Redlock over five local servers the test starts: majorities, dead servers, validity,
and mutual exclusion across processes."""

from __future__ import annotations

import asyncio
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import redis

from stampede import ConfigError, LockLost, LockNotOwned, Redlock, WaitTimeout
from stampede.testing import FaultProxy, RedisServer

from ..promises.test_processes import run_stampede
from ..scenarios import wait_until

pytestmark = pytest.mark.extended  # Redlock: CI's extended step (tests/conftest.py)

WORKER = str(Path(__file__).parent.parent.joinpath("mutex_worker.py"))


def test_a_majority_grants_the_lock_and_release_frees_it_everywhere(five: list[RedisServer]) -> None:
    with Redlock([server.url for server in five], namespace="rl") as manager:
        first = manager.lock("job", ttl=5)
        asked = time.monotonic()
        assert first.acquire()
        validity, elapsed = first.validity, time.monotonic() - asked
        drift = 5 * 0.01 + 0.002  # the default clock drift factor, and 2 ms
        # validity counts from when the servers were asked, less the drift: bounded by
        # the time this test measured around it, not by a guess at how fast that was
        assert first.last_granted == 5 and 5 - drift - elapsed <= validity <= 5 - drift
        assert first.owned() and first.locked()
        assert manager.lock("job", blocking=False).acquire() is False
        first.release()
        assert not first.locked()
        assert all(redis.Redis.from_url(s.url).exists(first.keys.lock) == 0 for s in five)
        with manager.lock("job", blocking=False) as second:
            assert second.owned()


@pytest.mark.timing
def test_two_servers_down_still_grant_three_down_refuse_within_the_timeout(five: list[RedisServer]) -> None:
    with Redlock([server.url for server in five], namespace="rl") as manager:
        five[0].kill()
        five[1].kill()
        with manager.lock("job", ttl=5) as lock:
            assert lock.last_granted == 3  # a majority of five
        five[2].kill()
        lock = manager.lock("job", ttl=5, timeout=0.5, retry_interval=0.05)
        started = time.monotonic()
        assert lock.acquire() is False
        elapsed = time.monotonic() - started
        assert 0.45 <= elapsed < 1.0, elapsed
        assert lock.last_granted == 2
        with pytest.raises(WaitTimeout, match="2 of 5 servers"):
            with manager.lock("job", ttl=5, blocking=False):
                pass  # pragma: no cover - never entered
        survivors = [redis.Redis.from_url(s.url) for s in five[3:]]
        assert all(client.exists(lock.keys.lock) == 0 for client in survivors)  # minority grants undone


def test_an_acquisition_slower_than_its_ttl_is_not_held(five: list[RedisServer]) -> None:
    """Three servers answer through a network 60 ms slow: a majority grants the lock only
    after 0.18 s, past a 0.15 s ttl. No validity is left, so the lock is not held and
    what was granted is released."""
    with ExitStack() as stack:
        proxies = [stack.enter_context(FaultProxy(server.port)) for server in five[:3]]
        for proxy in proxies:
            proxy.delay = 0.03  # each way
        urls = [proxy.url for proxy in proxies] + [server.url for server in five[3:]]
        manager = stack.enter_context(Redlock(urls, namespace="rl", socket_timeout=1))
        lock = manager.lock("job", ttl=0.15)
        assert lock.acquire(blocking=False) is False
        assert lock.last_granted == 5
        for proxy in proxies:
            proxy.delay = 0.0
        assert not lock.locked()


def test_release_after_the_validity_ran_out_raises_lock_lost(five: list[RedisServer]) -> None:
    with Redlock([server.url for server in five], namespace="rl") as manager:
        lock = manager.lock("job", ttl=0.2, renew=False)
        assert lock.acquire()
        time.sleep(0.3)
        assert lock.validity == 0 and not lock.owned()
        with pytest.raises(LockLost, match=r"majority \(0 of 5 confirmed\)"):
            lock.release()
        with pytest.raises(LockNotOwned):
            lock.release()
        with manager.lock("job", ttl=0.5) as held:
            held.extend(5)
            assert held.validity > 4.5


@pytest.mark.timing
def test_a_held_lock_is_renewed_on_a_majority_until_a_majority_is_gone(five: list[RedisServer]) -> None:
    """The watchdog renews the lease every ttl/3: held through more than three ttls,
    with its validity moving on. With three servers killed no majority renews it: the
    renewals stop, and the release reports the lock lost."""
    with Redlock([server.url for server in five], namespace="rl") as manager:
        with manager.lock("job", ttl=0.3) as lock:
            time.sleep(1.0)
            assert lock.owned()  # its validity too (> 0) was moved on by the renewals
            assert manager.lock("job", blocking=False).acquire() is False
            lock.extend(5)
            time.sleep(0.5)  # past a few renewals: they keep the new length
            assert all(2 < redis.Redis.from_url(s.url).pttl(lock.keys.lock) / 1000 <= 5 for s in five)
        lock = manager.lock("job", ttl=0.3)
        assert lock.acquire()
        for server in five[:3]:
            server.kill()
        wait_until(lambda: lock.validity == 0, "the validity to run out unrenewed", timeout=2)
        assert lock._renewal is not None and lock._renewal.lost  # type: ignore[union-attr]
        with pytest.raises(LockLost, match=r"\(2 of 5 confirmed, 3 did not answer in time\)"):
            lock.release()


def test_mutual_exclusion_across_four_processes_of_eight_threads(
    five: list[RedisServer], redis_url: str, redis_client: redis.Redis
) -> None:
    """No lost update among 32 threads taking a Redlock in turns. Redlock promises no
    fairness (a contender retries at random moments), so a thread a busy machine keeps out
    past its 30 s timeout tries again: the workers end within 50 s all the same."""
    others = [arg for server in five[1:] for arg in ("--url", server.url)]
    results = run_stampede(five[0].url, 4, *others, "--counter-url", redis_url, "--rounds", "4",
                           script=WORKER, timeout=50)  # fmt: skip
    assert sum(result["increments"] for result in results) == 4 * 8 * 4
    assert int(redis_client.get("redlock:counter") or 0) == 4 * 8 * 4  # no lost update


def test_bad_settings_are_refused(five: list[RedisServer]) -> None:
    with pytest.raises(ConfigError, match="at least one server"):
        Redlock([])
    with Redlock([five[0].url]) as manager, pytest.raises(ConfigError, match="ttl"):
        manager.lock("job", ttl=0)


@pytest.mark.timing
def test_tasks_take_turns_under_a_redlock_and_a_majority_down_refuses_them(five: list[RedisServer]) -> None:
    """The same decisions driven by awaits, each command sent to all five servers at once:
    20 tasks doing a read-await-write under the lock lose no update; with three servers
    down ``aacquire`` gives up within its timeout and ``async with`` raises."""

    async def main() -> None:
        async with Redlock([server.url for server in five], namespace="rl") as manager:
            shared = {"count": 0, "inside": 0, "most_inside": 0}

            async def increment() -> None:
                async with manager.lock("job", ttl=5, retry_interval=0.01, timeout=20) as lock:
                    assert lock.last_granted >= 3 and await lock.aowned()
                    shared["inside"] += 1
                    shared["most_inside"] = max(shared["most_inside"], shared["inside"])
                    count = shared["count"]
                    await asyncio.sleep(0.002)
                    shared["count"] = count + 1
                    shared["inside"] -= 1

            await asyncio.gather(*(increment() for _ in range(20)))
            assert shared["count"] == 20 and shared["most_inside"] == 1
            assert not await manager.lock("job").alocked()

            held = manager.lock("job", ttl=0.3)
            assert await held.aacquire()
            await asyncio.sleep(1.0)  # over three ttls: its renewal task keeps it
            assert await held.aowned()  # its validity too (> 0)
            await held.aextend(5)
            assert held.validity > 4.5
            await held.arelease()
            with pytest.raises(LockNotOwned):
                await held.arelease()

            for server in five[:3]:
                server.kill()
            lock = manager.lock("job", ttl=5, timeout=0.5, retry_interval=0.05)
            started = time.monotonic()
            assert await lock.aacquire() is False
            assert 0.45 <= time.monotonic() - started < 1.0
            assert lock.last_granted == 2
            with pytest.raises(WaitTimeout, match="2 of 5 servers"):
                async with manager.lock("job", blocking=False):
                    pass  # pragma: no cover - never entered
            survivors = [redis.Redis.from_url(s.url) for s in five[3:]]
            assert all(client.exists(lock.keys.lock) == 0 for client in survivors)

    asyncio.run(main())


def test_asyncio_callers_need_the_servers_as_urls(five: list[RedisServer]) -> None:
    clients = [redis.Redis.from_url(server.url) for server in five]

    async def main() -> None:
        with Redlock(clients) as manager:
            assert manager.lock("job").acquire()  # blocking callers are served
            with pytest.raises(ConfigError, match="as URLs"):
                await manager.lock("other").aacquire()

    asyncio.run(main())
