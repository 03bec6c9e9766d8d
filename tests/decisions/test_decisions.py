"""The lock and Redlock decisions, and the two performers' loops, without a server.

Each decision is stepped through by hand: the effect it asks for, the reply or the
exception sent back, the next effect. ``_core.flow`` has its own such tests (test_flow.py).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from stampede import BackendUnavailable
from stampede._core.acquiring import acquiring
from stampede._core.effects import (
    Acquire,
    Decision,
    Effect,
    Expire,
    Hold,
    Invalidate,
    LeaveQueue,
    Pause,
    ReadEntry,
    ReadValue,
    Release,
    Renew,
    ServersDrop,
    ServersRelease,
    ServersRenew,
    ServersTake,
    Subscribe,
    TakeLock,
    WriteRelease,
)
from stampede._core.keys import EntryKeys
from stampede._core.majority import Quorum, RedlockLeases, renew_majority, take_majority
from stampede._core.sessions import SessionLeases
from stampede._core.store import AcquireReply, LockState, Round, Written
from stampede._drivers.aperform import arun
from stampede._drivers.perform import Performer, run

KEYS = EntryKeys.for_value("t:{item:1}")
SERVER_KEYS = KEYS.on_lock_servers
HELD = AcquireReply(LockState.HELD, lease_left=4.0)
FIVE = Quorum(5, clock_drift_factor=0.01)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Interrupted(BaseException):
    """Stands for KeyboardInterrupt or a cancellation."""


def finish(decision: Decision[Any], reply: Any = None) -> Any:
    """Send the last reply; return what the decision returns."""
    with pytest.raises(StopIteration) as stop:
        decision.send(reply)
    return stop.value.value


# --- the performers' loops ---------------------------------------------------------------


def _releases_when_interrupted() -> Decision[str]:
    try:
        yield Acquire()
    except Interrupted:
        yield Release()
        raise
    return "done"


def test_run_throws_every_exception_back_into_the_decision_at_its_yield() -> None:
    performed: list[Effect] = []

    def perform(effect: Effect) -> Any:
        performed.append(effect)
        if isinstance(effect, Acquire):
            raise Interrupted()
        return True

    with pytest.raises(Interrupted):
        run(_releases_when_interrupted(), perform)
    assert performed == [Acquire(), Release()]  # the decision cleaned up before it propagated


def test_arun_throws_every_exception_back_into_the_decision_at_its_yield() -> None:
    performed: list[Effect] = []

    async def perform(effect: Effect) -> Any:
        performed.append(effect)
        if isinstance(effect, Acquire):
            raise Interrupted()
        return True

    with pytest.raises(Interrupted):
        asyncio.run(arun(_releases_when_interrupted(), perform))
    assert performed == [Acquire(), Release()]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="a task counts its cancellations from Python 3.11")
def test_arun_gives_the_decision_a_cancellation_the_effect_below_it_lost() -> None:
    """redis-py's Sentinel lookup, its read from one sentinel cut, asks the next and
    returns normally from a cancelled task. The decision must still be cancelled (and
    clean up), not go on as if nothing had been asked of it."""
    performed: list[Effect] = []
    started = asyncio.Event()

    async def perform(effect: Effect) -> Any:
        performed.append(effect)
        if isinstance(effect, Acquire):
            started.set()
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                pass  # lost, as the client below does
        return True

    async def main() -> None:
        running = asyncio.ensure_future(arun(_releases_when_cancelled(), perform))
        await started.wait()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(running, 5)

    asyncio.run(main())
    assert performed == [Acquire(), Release()]  # cancelled at Acquire, cleaned up once


def _releases_when_cancelled() -> Decision[str]:
    try:
        yield Acquire()
    except asyncio.CancelledError:
        yield Release()  # ends normally: the clean-up is not cancelled again
        raise
    yield ReadValue()  # the cancellation was lost: this is what must not happen
    return "done"


def test_a_performer_without_a_store_refuses_a_store_effect_by_name() -> None:
    with pytest.raises(TypeError, match="no store"):
        Performer()(ReadValue())


# --- named locks: acquiring -------------------------------------------------------------


def test_interrupted_while_taking_the_lock_it_releases_by_token_and_leaves_the_queue() -> None:
    decision = acquiring(blocking=True, timeout=None, retry_interval=None, retries=None,
                         recheck_interval=1.0, queue_lease=3.0)  # fmt: skip
    assert next(decision) == TakeLock()
    assert decision.throw(Interrupted()) == Release()  # the take may have run
    assert decision.send(True) == LeaveQueue()
    with pytest.raises(Interrupted):
        decision.send(None)


def test_a_store_error_while_taking_the_lock_leaves_the_queue_but_releases_nothing() -> None:
    decision = acquiring(blocking=True, timeout=None, retry_interval=None, retries=None,
                         recheck_interval=1.0, queue_lease=3.0)  # fmt: skip
    next(decision)
    assert decision.throw(BackendUnavailable("down")) == LeaveQueue()
    with pytest.raises(BackendUnavailable):
        decision.throw(BackendUnavailable("still down"))  # cleanup's own failure is swallowed, the first raised


def test_interrupted_while_waiting_a_plain_lock_has_nothing_to_undo() -> None:
    decision = acquiring(blocking=True, timeout=None, retry_interval=None, retries=None, recheck_interval=1.0)
    next(decision)
    assert decision.send(HELD) == Subscribe()
    with pytest.raises(Interrupted):
        decision.throw(Interrupted())


def test_a_fair_waiter_out_of_time_leaves_the_queue_and_gets_none() -> None:
    clock = Clock()
    decision = acquiring(blocking=True, timeout=0.5, retry_interval=0.1, retries=None, recheck_interval=1.0,
                         clock=clock, queue_lease=3.0)  # fmt: skip
    next(decision)
    assert decision.send(HELD) == Pause(0.1)
    clock.now += 0.6
    assert decision.send(None) == TakeLock()
    assert decision.send(HELD) == LeaveQueue()
    assert finish(decision) is None


def test_the_fence_of_a_taken_lock_is_returned() -> None:
    decision = acquiring(blocking=False, timeout=None, retry_interval=None, retries=None, recheck_interval=1.0)
    next(decision)
    assert finish(decision, AcquireReply(LockState.LOCKED, fence=42)) == 42


# --- Redlock: the majority ----------------------------------------------------------------


def test_quorum_arithmetic() -> None:
    assert [Quorum(n, 0.01).needed for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert FIVE.valid_until(started=10.0, ttl=10.0) == pytest.approx(10.0 + 10.0 - 0.1 - 0.002)
    assert FIVE.holds(Round(3, 2), valid_until=20.0, now=19.9)
    assert not FIVE.holds(Round(3, 0), valid_until=20.0, now=20.0)  # a late majority holds nothing
    assert not FIVE.holds(Round(2, 0), valid_until=20.0, now=10.0)
    assert FIVE.reachable(Round(0, 2)) and not FIVE.reachable(Round(0, 3))


def test_a_majority_in_time_holds_the_lease_until_its_validity() -> None:
    clock = Clock()
    decision = take_majority(FIVE, KEYS, "t", 10_000, clock)
    assert next(decision) == ServersTake(KEYS, "t", 10_000)
    clock.now += 0.5
    taken, valid_until = finish(decision, Round(3, 2))
    assert taken == Round(3, 2) and valid_until == pytest.approx(100.0 + 10.0 - 0.102)


def test_a_minority_is_undone_and_holds_nothing() -> None:
    decision = take_majority(FIVE, KEYS, "t", 10_000, Clock())
    next(decision)
    assert decision.send(Round(2, 0)) == ServersRelease(KEYS, "t")
    assert finish(decision, Round(2, 0)) == (Round(2, 0), None)


def test_a_majority_granted_too_late_is_undone() -> None:
    clock = Clock()
    decision = take_majority(FIVE, KEYS, "t", 1_000, clock)
    next(decision)
    clock.now += 1.0  # the whole validity went by while the servers answered
    assert decision.send(Round(5, 0)) == ServersRelease(KEYS, "t")
    assert finish(decision)[1] is None


def test_a_refusal_everywhere_sends_no_release() -> None:
    decision = take_majority(FIVE, KEYS, "t", 10_000, Clock())
    next(decision)
    assert finish(decision, Round(0, 1, lease_left=2.0)) == (Round(0, 1, lease_left=2.0), None)


def test_interrupted_while_taking_a_majority_it_releases_everywhere() -> None:
    decision = take_majority(FIVE, KEYS, "t", 10_000, Clock())
    next(decision)
    assert decision.throw(Interrupted()) == ServersRelease(KEYS, "t")
    with pytest.raises(Interrupted):
        decision.send(Round(0, 0))


def test_a_renewal_needs_a_majority_in_time() -> None:
    decision = renew_majority(FIVE, KEYS, "t", 6_000, Clock())
    assert next(decision) == ServersRenew(KEYS, "t", 6_000)
    assert finish(decision, Round(3, 0))[1] is not None
    decision = renew_majority(FIVE, KEYS, "t", 6_000, Clock())
    next(decision)
    assert finish(decision, Round(2, 3))[1] is None


# --- Redlock: a layer's leases on the lock servers and the cache server -----------------


LEASES = RedlockLeases(FIVE, Clock())


def test_a_layer_lease_takes_the_majority_then_the_cache_key() -> None:
    decision = LEASES.acquire(KEYS, "t", 10_000, check_value=True)
    assert next(decision) == ServersTake(SERVER_KEYS, "t", 10_000)
    assert decision.send(Round(3, 0)) == Acquire(check_value=True)
    assert finish(decision, AcquireReply(LockState.LOCKED)) == AcquireReply(LockState.LOCKED)


def test_a_value_found_under_the_majority_gives_the_majority_back() -> None:
    decision = LEASES.acquire(KEYS, "t", 10_000, check_value=True)
    next(decision)
    value = AcquireReply(LockState.VALUE, b"v")
    assert decision.send(Round(5, 0)) == Acquire(check_value=True)
    assert decision.send(value) == ServersRelease(SERVER_KEYS, "t")
    assert finish(decision, Round(5, 0)) == value


def test_a_refused_majority_reads_the_value_then_reports_the_holder() -> None:
    decision = LEASES.acquire(KEYS, "t", 10_000, check_value=True)
    next(decision)
    assert decision.send(Round(0, 0, lease_left=3.0)) == ReadEntry()
    assert finish(decision, (None, -1.0, False)) == AcquireReply(LockState.HELD, lease_left=3.0)


def test_a_refused_majority_over_an_entry_marked_failing_is_a_failed_loads_hold() -> None:
    """The hold lives on the cache server, which a caller the majority refused does not
    reach: the failing mark tells it, so that a caller with a stale value serves it now
    (the majority may be held by a refresh that finds the hold and says nothing)."""
    decision = LEASES.acquire(KEYS, "t", 10_000, check_value=True, stale=b"old")
    next(decision)
    assert decision.send(Round(0, 0, lease_left=3.0)) == ReadEntry()
    held = finish(decision, (b"old-envelope", 0.2, True))
    assert held == AcquireReply(LockState.HELD, lease_left=3.0, failed=True)


def test_a_refused_majority_finding_a_new_value_tells_its_time_left() -> None:
    decision = LEASES.acquire(KEYS, "t", 10_000, check_value=True, stale=b"old")
    next(decision)
    decision.send(Round(0, 0, lease_left=3.0))
    found = finish(decision, (b"new-envelope", 4.5, False))
    assert found == AcquireReply(LockState.VALUE, b"new-envelope") and found.ttl_left == 4.5


def test_too_few_lock_servers_answering_is_a_backend_failure() -> None:
    decision = LEASES.acquire(KEYS, "t", 10_000, check_value=True)
    next(decision)
    with pytest.raises(BackendUnavailable, match="2 of 5 lock servers"):
        decision.send(Round(0, 3))


def test_interrupted_at_the_cache_key_the_majority_is_released() -> None:
    decision = LEASES.acquire(KEYS, "t", 10_000, check_value=True)
    next(decision)
    decision.send(Round(3, 0))
    assert decision.throw(Interrupted()) == ServersRelease(SERVER_KEYS, "t")
    with pytest.raises(Interrupted):
        decision.send(Round(3, 0))


def test_a_layer_write_goes_to_the_cache_before_the_majority_is_released() -> None:
    decision = LEASES.write_release(KEYS, "t", b"env", 5_000, inline=True)
    assert next(decision) == WriteRelease(b"env", 5_000, True)
    assert decision.send(Written.YES) == ServersRelease(SERVER_KEYS, "t")
    assert finish(decision, Round(3, 0)) is Written.YES
    failing = LEASES.write_release(KEYS, "t", b"env", 5_000, inline=True)
    next(failing)
    assert failing.throw(BackendUnavailable("cut")) == ServersRelease(SERVER_KEYS, "t")  # released all the same


def test_a_layer_release_frees_the_majority_before_waking_the_waiters() -> None:
    decision = LEASES.release(KEYS, "t")
    assert next(decision) == ServersRelease(SERVER_KEYS, "t")
    assert decision.send(Round(3, 0)) == Release()
    assert finish(decision, True) is True


def test_an_invalidation_drops_the_majority_first() -> None:
    decision = LEASES.invalidate(KEYS)
    assert next(decision) == ServersDrop(SERVER_KEYS)
    assert decision.send(Round(5, 0)) == Invalidate()
    assert finish(decision) is None


def test_a_layer_renewal_renews_the_cache_key_best_effort() -> None:
    decision = LEASES.renew(KEYS, "t", 9_000)
    assert next(decision) == ServersRenew(SERVER_KEYS, "t", 9_000)
    assert decision.send(Round(3, 0)) == Renew(9_000)
    with pytest.raises(StopIteration) as stop:
        decision.throw(BackendUnavailable("cache down"))
    assert stop.value.value is True  # the majority keeps other loads out
    lost = LEASES.renew(KEYS, "t", 9_000)
    next(lost)
    assert finish(lost, Round(1, 0)) is False


# --- ZooKeeper: leases bound to a session (``_core.sessions``) ---------------------------


ONE = Quorum(1, 0.0)
SESSIONS = SessionLeases(ONE, Clock())


def test_a_cache_key_held_when_zookeeper_granted_the_lease_is_taken_over() -> None:
    """Every release gives the cache key up before the node: a key still held is a holder
    whose session ended, and its write must be refused (Expire leaves the marker)."""
    decision = SESSIONS.acquire(KEYS, "t", 10_000, check_value=True)
    assert next(decision) == ServersTake(SERVER_KEYS, "t", 10_000)
    assert decision.send(Round(1, 0)) == Acquire(check_value=True)
    assert decision.send(AcquireReply(LockState.HELD, lease_left=25.0)) == Expire()
    assert decision.send(None) == Acquire(check_value=True)
    assert finish(decision, AcquireReply(LockState.LOCKED)) == AcquireReply(LockState.LOCKED)


def test_a_failed_loads_hold_is_no_holder_and_is_not_taken_over() -> None:
    decision = SESSIONS.acquire(KEYS, "t", 10_000, check_value=True)
    next(decision)
    decision.send(Round(1, 0))
    held = AcquireReply(LockState.HELD, lease_left=0.5, failed=True)
    assert decision.send(held) == ServersRelease(SERVER_KEYS, "t")
    assert finish(decision, Round(1, 0)) == held


def test_zookeeper_down_is_a_backend_failure_and_a_refusal_reads_the_value() -> None:
    decision = SESSIONS.acquire(KEYS, "t", 10_000, check_value=True)
    next(decision)
    with pytest.raises(BackendUnavailable, match="0 of 1 lock servers"):
        decision.send(Round(0, 1))
    refused = SESSIONS.acquire(KEYS, "t", 10_000, check_value=True)
    next(refused)
    assert refused.send(Round(0, 0, lease_left=10.0)) == ReadEntry()
    assert finish(refused, (b"v", -1.0, False)) == AcquireReply(LockState.VALUE, b"v")


def test_a_holder_whose_session_ended_writes_nothing_and_gives_the_key_back() -> None:
    decision = SESSIONS.write_release(KEYS, "t", b"env", 5_000, inline=True)
    assert next(decision) == ServersRenew(SERVER_KEYS, "t", 0)
    assert decision.send(Round(0, 0)) == Release()
    assert decision.send(False) == ServersRelease(SERVER_KEYS, "t")
    assert finish(decision, Round(0, 0)) is Written.REFUSED
    alive = SESSIONS.write_release(KEYS, "t", b"env", 5_000, inline=True)
    next(alive)
    assert alive.send(Round(1, 0)) == WriteRelease(b"env", 5_000, True)
    assert alive.send(Written.YES) == ServersRelease(SERVER_KEYS, "t")
    assert finish(alive, Round(1, 0)) is Written.YES


def test_a_session_lease_gives_up_the_cache_key_before_its_node() -> None:
    decision = SESSIONS.release(KEYS, "t")
    assert next(decision) == Release()
    assert decision.send(True) == ServersRelease(SERVER_KEYS, "t")
    assert finish(decision, Round(1, 0)) is True
    hold = SESSIONS.hold(KEYS, "t", 500, 30_000)
    assert next(hold) == Hold(500, 30_000)
    assert hold.send(True) == ServersRelease(SERVER_KEYS, "t")
    assert finish(hold, Round(1, 0)) is True


@pytest.mark.parametrize("leases", [LEASES, SESSIONS], ids=["redlock", "zookeeper"])
@pytest.mark.parametrize("step", ["write_release", "release", "hold"])
def test_a_lease_decision_closed_at_its_yield_closes_quietly(leases: RedlockLeases, step: str) -> None:
    """A decision whose caller goes away (``close()``: GeneratorExit at its yield) must not
    yield its cleanup: a generator that yields after GeneratorExit is a RuntimeError. Its
    servers' leases end by their term, or with the session."""
    decisions = {
        "write_release": lambda: leases.write_release(KEYS, "t", b"env", 5_000, inline=True),
        "release": lambda: leases.release(KEYS, "t"),
        "hold": lambda: leases.hold(KEYS, "t", 1_000, 1_000),
    }
    decision = decisions[step]()
    next(decision)
    decision.close()  # no RuntimeError("generator ignored GeneratorExit")
    thrown = decisions[step]()
    effect = next(thrown)
    if isinstance(effect, ServersRelease):
        return  # the servers are released first: nothing is left to release after an error
    assert thrown.throw(Interrupted()) == ServersRelease(SERVER_KEYS, "t")  # an error still releases them
    with pytest.raises(Interrupted):
        thrown.send(Round(1, 0))
