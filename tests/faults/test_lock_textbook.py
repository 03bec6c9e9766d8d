"""The textbook broken Redis locks, each reproduced against a real server, and the same
interleaving run against ``layer.lock``, where the property holds.

Each broken recipe is written out with plain commands, its failure point made
deterministic (a crash is a step not taken, a pause is waiting for the lease to run out),
and the test asserts that the recipe *does* break: two holders at once, or a lock that
never frees. Then the same story with stampede's lock asserts it does not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis

from stampede import LockLost, Stampede
from stampede.testing import CommandMonitor, names

from ..scenarios import wait_until

KEY = "textbook:lock"


def expired(client: redis.Redis, key: str) -> bool:
    return int(client.pttl(key)) == -2  # type: ignore[arg-type]


@pytest.mark.timing
def test_setnx_then_expire_deadlocks_after_a_crash_between_them(
    redis_client: redis.Redis, make_layer: Callable[..., Stampede]
) -> None:
    # Broken: SETNX, then EXPIRE in a second command; the holder crashes in between.
    assert redis_client.setnx(KEY, "a")
    # (crash: EXPIRE never sent)
    assert redis_client.pttl(KEY) == -1  # no expiry: nobody will ever get this lock
    assert not redis_client.setnx(KEY, "b")

    # stampede: the lease and its expiry are one command; a holder that "crashes" right
    # after taking it (never renews, never releases) leaves a lock that frees by itself.
    layer = make_layer()
    crashed = layer.lock("job", ttl=0.3, renew=False)
    assert crashed.acquire()
    assert 0 < int(redis_client.pttl(crashed.keys.lock)) <= 300  # type: ignore[arg-type]
    started = time.monotonic()
    with layer.lock("job", timeout=2):
        assert time.monotonic() - started < 0.3 + 0.2


def test_a_plain_del_by_a_holder_whose_lease_ran_out_frees_someone_elses_lock(
    redis_client: redis.Redis, make_layer: Callable[..., Stampede]
) -> None:
    # Broken: release by DEL. A's lease runs out while it works; B takes the lock; A,
    # done, deletes it: C takes it while B still works. Two holders.
    assert redis_client.set(KEY, "a", nx=True, px=100)
    wait_until(lambda: expired(redis_client, KEY), "A's lease to run out")
    assert redis_client.set(KEY, "b", nx=True, px=10_000)  # B holds
    redis_client.delete(KEY)  # A releases "its" lock
    assert redis_client.set(KEY, "c", nx=True, px=10_000)  # C holds too: B and C at once

    # stampede: A's release compares the token; it finds B's and deletes nothing.
    layer = make_layer()
    a = layer.lock("job", ttl=0.1, renew=False)
    assert a.acquire()
    wait_until(lambda: not a.locked(), "A's lease to run out")
    with layer.lock("job") as b:
        try:
            a.release()
            raise AssertionError("A's release should have reported the lease lost")
        except LockLost:
            pass
        assert b.owned()
        assert layer.lock("job", blocking=False).acquire() is False  # C is kept out


def test_get_then_del_release_has_a_window_between_the_two(
    redis_client: redis.Redis, redis_url: str, make_layer: Callable[..., Stampede]
) -> None:
    # Broken: release = GET (is it still mine?) then DEL, two commands. A's GET says yes;
    # A pauses; its lease runs out; B takes the lock; A's DEL deletes B's lock.
    assert redis_client.set(KEY, "a", nx=True, px=200)
    assert redis_client.get(KEY) == b"a"  # A: still mine
    wait_until(lambda: expired(redis_client, KEY), "A's lease to run out (A is paused)")
    assert redis_client.set(KEY, "b", nx=True, px=10_000)
    redis_client.delete(KEY)  # A goes on with its DEL
    assert redis_client.set(KEY, "c", nx=True, px=10_000)  # B and C at once

    # stampede: compare and delete are one script, one command: there is no between.
    layer = make_layer()
    lock = layer.lock("job")
    assert lock.acquire()
    with CommandMonitor(redis_url) as monitor:
        lock.release()
        assert names(monitor.checkpoint()) == ["EVALSHA"]


def test_timestamp_locks_let_a_client_with_a_fast_clock_in(
    redis_client: redis.Redis, make_layer: Callable[..., Stampede]
) -> None:
    # Broken: SETNX key <expiry by my clock>; if taken and the stored expiry has passed by
    # my clock, GETSET a new one and take it if the old value had expired. The server never
    # decides expiry: a client whose clock runs 5 s ahead takes a live lock.
    def take(client_clock: float, timeout: float = 10.0) -> bool:
        if redis_client.setnx(KEY, client_clock + timeout):
            return True
        current = float(redis_client.get(KEY) or 0)
        if current > client_clock:
            return False
        previous = float(redis_client.getset(KEY, client_clock + timeout) or 0)
        return previous <= client_clock

    now = time.time()
    assert take(now, timeout=3)  # A holds until now + 3, by its clock
    assert take(now + 5)  # B's clock is 5 s ahead: it sees A's lock expired and takes it

    # stampede: the lease is the server's PX; no client clock is consulted, so a second
    # holder gets nothing while the first holds, whatever its clock says.
    layer = make_layer()
    with layer.lock("job", ttl=3):
        assert layer.lock("job", blocking=False).acquire() is False


@pytest.mark.timing
def test_sleep_spinning_waiters_poll_and_hand_over_late(
    redis_client: redis.Redis, redis_url: str, make_layer: Callable[..., Stampede]
) -> None:
    """A holder keeps the lock 0.5 s. A sleep-spin waiter (SET NX, sleep 100 ms) tries
    again and again and takes the lock up to 100 ms after the release; stampede's waiter
    tries three times and takes it at the release."""
    assert redis_client.set(KEY, "holder", px=10_000)
    tries = {"spin": 0}
    taken: dict[str, float] = {}

    def spin() -> None:
        while True:
            tries["spin"] += 1
            if redis_client.set(KEY, "spinner", nx=True, px=10_000):
                taken["spin"] = time.monotonic()
                return
            time.sleep(0.1)

    spinner = threading.Thread(target=spin)
    spinner.start()
    time.sleep(0.5)  # the holder's work
    redis_client.delete(KEY)
    released = time.monotonic()
    spinner.join(5)
    assert tries["spin"] >= 5  # it polled all along

    layer, other = make_layer(), make_layer()
    holder = layer.lock("job", ttl=30)
    assert holder.acquire()
    with CommandMonitor(redis_url) as monitor:
        waiter = threading.Thread(target=lambda: other.lock("job", ttl=30).acquire() and taken.setdefault(
            "stampede", time.monotonic()))  # fmt: skip
        waiter.start()
        wait_until(lambda: redis_client.pubsub_numsub(holder.keys.channel)[0][1] == 1)
        time.sleep(0.5)  # the holder's work
        handed_at = time.monotonic()
        holder.release()
        waiter.join(5)
        commands = [c for c in monitor.checkpoint() if c[0] == "EVALSHA"]
    assert taken["stampede"] - handed_at < 0.05, taken["stampede"] - handed_at
    assert len(commands) == 1 + 3  # the holder's release; the waiter's three tries
    assert 0 <= taken["spin"] - released < 0.2  # the spinner gets it on its next poll, 0-100 ms late


@pytest.mark.timing
def test_a_lease_without_renewal_runs_out_under_a_long_holder(
    redis_client: redis.Redis, make_layer: Callable[..., Stampede]
) -> None:
    # Broken: SET NX PX 200 and no renewal; the work takes longer; B gets in mid-work.
    assert redis_client.set(KEY, "a", nx=True, px=200)
    wait_until(lambda: expired(redis_client, KEY), "A's lease to run out mid-work")
    assert redis_client.set(KEY, "b", nx=True, px=10_000)  # A and B at once

    # stampede: the lease is renewed every ttl/3 while held; B stays out for the whole
    # 0.9 s of work, three leases long, and gets in once A is done.
    layer, other = make_layer(), make_layer()
    intruded = []
    with layer.lock("job", ttl=0.3):
        deadline = time.monotonic() + 0.9
        while time.monotonic() < deadline:
            if other.lock("job", blocking=False).acquire():
                intruded.append(time.monotonic())
            time.sleep(0.05)
    assert intruded == []
    with other.lock("job", blocking=False):
        pass
