"""The flow's decisions, stepped by hand: no server, no threads, no sleeping."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from stampede import BackendUnavailable, SerializationError, ValueTooLarge, WaitTimeout
from stampede._core.codec import Codec
from stampede._core.config import Settings
from stampede._core.effects import (
    LEASE_MARGIN,
    Acquire,
    AwaitNotice,
    Lease,
    LeaseLost,
    Load,
    ReadEntry,
    ReadValue,
    Release,
    ServersRelease,
    ServersTake,
    ServersWatch,
    SettleNotice,
    Subscribe,
    WriteRelease,
)
from stampede._core.flow import Context, Miss, after_wait_timeout, failed_read, fill, produces_value, refresh
from stampede._core.keys import EntryKeys
from stampede._core.majority import Quorum, RedlockLeases
from stampede._core.sessions import SessionLeases
from stampede._core.store import AcquireReply, LockState, Round, Written
from stampede._drivers.observe import Events, RateLimitedLog

CODEC = Codec()
KEYS = EntryKeys.for_value("t:{item:1}")
HELD = AcquireReply(LockState.HELD, lease_left=4.0)
LOCKED = AcquireReply(LockState.LOCKED)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_ctx(**settings: Any) -> tuple[Context, Clock]:
    clock = Clock()
    ctx = Context(
        keys=KEYS,
        settings=Settings(**settings),
        codec=CODEC,
        events=Events("test", RateLimitedLog(logging.getLogger("test"))),
        warn=RateLimitedLog(logging.getLogger("test")),
        clock=clock,
        wall_clock=lambda: 1_700_000_000.0,
        uniform=lambda low, high: high,
    )
    return ctx, clock


def envelope(value: Any) -> bytes:
    return CODEC.encode(value, 1.0, 0.5, key="k")


class Stepper:
    """Drives a flow one effect at a time, as a driver would."""

    def __init__(self, flow: Any) -> None:
        self.flow = flow
        self.effect = next(flow)
        self.result: Any = None
        self.done = False

    def reply(self, value: Any = None) -> Any:
        return self._advance(lambda: self.flow.send(value))

    def fail(self, error: BaseException) -> Any:
        return self._advance(lambda: self.flow.throw(error))

    def _advance(self, step: Any) -> Any:
        try:
            self.effect = step()
        except StopIteration as stop:
            self.effect, self.result, self.done = None, stop.value, True
        return self.effect


def test_the_holder_loads_writes_and_returns() -> None:
    ctx, clock = make_ctx(ttl=60, jitter=0.1)
    step = Stepper(fill(ctx))
    assert step.effect == Acquire(check_value=True)
    assert step.reply(LOCKED) == Load(leased=True)
    clock.now += 0.25
    write = step.reply({"a": 1})
    assert isinstance(write, WriteRelease)
    assert write.ttl_ms == 66000  # the injected jitter picks the top of +/-10%
    assert write.inline
    decoded = CODEC.decode(write.envelope)
    assert (decoded.value, decoded.loaded_at, decoded.load_duration) == ({"a": 1}, 1_700_000_000.0, 0.25)
    step.reply(True)
    assert step.done and step.result == {"a": 1}
    assert ctx.events.counts.snapshot()["loads"] == 1


def test_none_is_written_as_the_null_sentinel_with_null_ttl() -> None:
    ctx, _ = make_ctx(null_ttl=5, jitter=0)
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    write = step.reply(None)
    assert write.ttl_ms == 5000 and CODEC.decode(write.envelope).kind.name == "NULL"


def test_a_value_found_on_the_recheck_is_returned_without_loading() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(AcquireReply(LockState.VALUE, envelope([1, 2])))
    assert step.done and step.result == [1, 2]
    assert ctx.events.counts.snapshot()["loads"] == 0


def test_a_waiter_subscribes_then_rechecks_then_waits_at_most_the_lease() -> None:
    ctx, _ = make_ctx(wait_timeout=30, recheck_interval=10)
    step = Stepper(fill(ctx))
    assert step.reply(HELD) == Subscribe()
    assert step.reply(None) == Acquire(check_value=True)  # the re-check after subscribing
    assert step.reply(HELD) == AwaitNotice(timeout=4.0 + LEASE_MARGIN)
    assert not ctx.via_notice
    step.reply(envelope("v"))
    assert step.done and step.result == "v"
    assert ctx.via_notice  # so the driver shares it only with who arrived before the subscription
    assert ctx.events.counts.snapshot()["lock_waits"] == 1


def test_waits_are_bounded_by_recheck_interval_and_the_deadline() -> None:
    ctx, clock = make_ctx(wait_timeout=3, recheck_interval=1)
    step = Stepper(fill(ctx))
    step.reply(HELD)
    step.reply(None)
    assert step.reply(HELD) == AwaitNotice(timeout=1)
    clock.now += 2.5
    step.reply(b"")  # a state change: re-check
    assert step.reply(HELD) == AwaitNotice(timeout=pytest.approx(0.5))


def test_silence_then_a_free_lock_is_a_takeover() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(HELD)
    step.reply(None)
    step.reply(HELD)
    assert step.reply(None) == Acquire(check_value=True)  # no message: the holder may be dead
    assert step.reply(LOCKED) == SettleNotice()  # whatever its holder's message said has come in
    assert step.reply(None) == Load(leased=True)
    assert ctx.events.counts.snapshot()["takeovers"] == 1


def test_a_free_lock_after_a_message_still_on_its_way_takes_its_value_and_gives_the_lease_back() -> None:
    """The holder handed its value to its waiters only (store=False): nothing to re-check,
    and its message came in after the re-check found the lock free."""
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(HELD)
    step.reply(None)
    step.reply(HELD)
    step.reply(b"")  # a message that says only that the state changed
    assert step.reply(LOCKED) == SettleNotice()
    envelope, _, _ = ctx.codec.encode_counted("theirs", 0.0, 0.0, key="k")
    assert step.reply(envelope) == Release()
    step.reply(True)
    assert step.done and step.result == "theirs" and ctx.via_notice


def test_a_release_notice_then_a_free_lock_is_not_a_takeover() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(HELD)
    step.reply(None)
    step.reply(HELD)
    step.reply(b"")  # the holder released (its loader raised)
    assert step.reply(LOCKED) == SettleNotice()
    assert step.reply(b"") == Load(leased=True)
    assert ctx.events.counts.snapshot()["takeovers"] == 0


@pytest.mark.parametrize("policy", ["load", "raise"])
def test_the_deadline_applies_the_wait_timeout_policy(policy: str) -> None:
    ctx, clock = make_ctx(wait_timeout=2, on_wait_timeout=policy)
    step = Stepper(fill(ctx))
    step.reply(HELD)
    step.reply(None)
    clock.now += 2
    if policy == "raise":
        with pytest.raises(WaitTimeout):
            step.reply(HELD)
    else:
        assert step.reply(HELD) == Load(leased=False)  # loads for itself, writes nothing
        step.reply("mine")
        assert step.done and step.result == "mine"
    assert ctx.events.counts.snapshot()["wait_timeouts"] == 1


@pytest.mark.parametrize("policy", ["load", "raise"])
def test_a_failing_store_applies_the_redis_error_policy(policy: str) -> None:
    ctx, _ = make_ctx(on_backend_error=policy)
    step = Stepper(fill(ctx))
    error = BackendUnavailable("down", key=KEYS.value)
    if policy == "raise":
        with pytest.raises(BackendUnavailable):
            step.fail(error)
    else:
        assert step.fail(error) == Load(leased=False)
        step.reply("uncached")
        assert step.done and step.result == "uncached"
    assert ctx.events.counts.snapshot()["redis_errors"] == 1


def test_a_failed_first_read_goes_straight_to_the_policy() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx, failed_read(ctx.events, ctx.warn, BackendUnavailable("no permission to read k"))))
    assert step.effect == Load(leased=False)
    strict, _ = make_ctx(on_backend_error="raise")
    with pytest.raises(BackendUnavailable, match="no permission to read k"):  # the cause, not a generic error
        Stepper(fill(strict, failed_read(strict.events, strict.warn, BackendUnavailable("no permission to read k"))))


def test_a_loader_error_releases_the_lock_and_propagates() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    assert step.fail(KeyError("db")) == Release()
    with pytest.raises(KeyError):
        step.reply(None)
    assert ctx.events.counts.snapshot()["loader_errors"] == 1


def test_a_load_whose_lease_was_taken_before_its_loader_ran_gives_back_the_rest_and_starts_over() -> None:
    """The load waited for a budget slot, and an invalidation took its lease meanwhile
    (``LeaseLost``: the loader did not run). What is left of the lease is released by
    token, and the caller asks again: here it waits for the caller who took the lease."""
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    assert step.fail(LeaseLost()) == Release()
    assert step.reply(False) == Acquire(check_value=True)
    assert step.reply(HELD) == Subscribe()
    assert step.reply(None) == Acquire(check_value=True)
    assert isinstance(step.reply(HELD), AwaitNotice)
    step.reply(envelope({"a": 2}))
    assert step.done and step.result == {"a": 2}
    counts = ctx.events.counts.snapshot()
    assert counts["loader_errors"] == 0 and counts.get("stale_writes_prevented", 0) == 0


def test_a_refresh_whose_lease_was_taken_before_its_loader_ran_gives_back_the_rest_and_ends() -> None:
    """On Redlock too: the majority and the cache key, whatever is left of either."""
    ctx, _ = make_ctx()
    ctx.leases = RedlockLeases(Quorum(3, 0.0)).bind(Lease(KEYS, "t", 9_000))
    servers = KEYS.on_lock_servers
    step = Stepper(refresh(ctx, b"stale"))
    step.reply(Round(3, 0))
    assert step.reply(LOCKED) == Load(leased=True)
    assert step.fail(LeaseLost()) == ServersRelease(servers, "t")
    assert step.reply(Round(0, 0)) == Release()
    step.reply(False)
    assert step.done and step.result is None
    counts = ctx.events.counts.snapshot()
    assert counts["refreshes"] == 1 and counts.get("refresh_errors", 0) == 0 and counts["loader_errors"] == 0


class Interrupted(BaseException):
    """Stands for a cancelled task or a KeyboardInterrupt."""


@pytest.mark.parametrize("at", ["acquire", "load", "write"])
def test_an_interrupted_caller_releases_the_lock_it_may_hold(at: str) -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    if at != "acquire":
        step.reply(LOCKED)
        if at == "write":
            assert isinstance(step.reply("v"), WriteRelease)
    assert step.fail(Interrupted()) == Release()
    with pytest.raises(Interrupted):
        step.reply(None)
    assert ctx.events.counts.snapshot()["loader_errors"] == 0


def test_an_interrupted_waiter_has_nothing_to_release() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(HELD)
    with pytest.raises(Interrupted):
        step.fail(Interrupted())


def test_an_unencodable_value_releases_the_lock_and_raises() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    assert step.reply({1, 2}) == Release()
    with pytest.raises(SerializationError):
        step.reply(None)
    assert ctx.events.counts.snapshot()["loader_errors"] == 0


def test_a_value_over_the_size_limit_releases_the_lock_and_raises() -> None:
    ctx, _ = make_ctx(max_value_bytes=100)
    fits = Stepper(fill(ctx))
    fits.reply(LOCKED)
    assert isinstance(fits.reply("x" * 82), WriteRelease)  # 16 bytes of envelope + 84 of JSON = 100
    too_large = Stepper(fill(ctx))
    too_large.reply(LOCKED)
    assert too_large.reply("x" * 83) == Release()
    with pytest.raises(ValueTooLarge, match="101 bytes"):
        too_large.reply(None)


def test_a_lost_lease_is_counted_and_the_value_still_returned() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    step.reply("v")
    assert not ctx.unwritten
    step.reply(False)
    assert step.done and step.result == "v"
    assert ctx.events.counts.snapshot()["stale_writes_prevented"] == 1
    assert ctx.unwritten  # so the driver does not hand it to this process's joiners


def test_a_failed_write_releases_the_lease_and_returns_the_value_but_not_to_joiners() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    assert isinstance(step.reply("v"), WriteRelease)
    # An error reply (OOM, a refused expiry) wrote nothing: the lease must not outlive it.
    assert step.fail(BackendUnavailable("OOM command not allowed", key=KEYS.value)) == Release()
    step.fail(BackendUnavailable("and the release fails too", key=KEYS.value))  # best effort
    assert step.done and step.result == "v"
    assert ctx.unwritten  # the write may have been refused by an invalidation: joiners read again


def test_a_write_that_timed_out_leaves_the_lease_to_run_out() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    step.reply("v")
    step.fail(BackendUnavailable("timed out", key=KEYS.value, timed_out=True))
    assert step.done and step.result == "v"  # no release: a stalled server would hold us again


def test_a_lease_that_vanished_within_its_term_is_counted_as_evicted() -> None:
    ctx, clock = make_ctx(lock_ttl=10)
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    clock.now += 1.0  # well inside the 10 s lease: only the server can have dropped it
    step.reply("v")
    step.reply(Written.VANISHED)
    assert step.done and step.result == "v" and ctx.unwritten
    assert ctx.events.counts.snapshot()["evicted_leases"] == 1
    assert ctx.events.counts.snapshot()["stale_writes_prevented"] == 1


def test_a_refused_write_or_a_lease_past_its_term_is_not_an_eviction() -> None:
    for written, elapsed in ((Written.REFUSED, 1.0), (Written.VANISHED, 10.0)):
        ctx, clock = make_ctx(lock_ttl=10)
        step = Stepper(fill(ctx))
        step.reply(LOCKED)
        clock.now += elapsed  # invalidated mid-load; or a lease that may have run out
        step.reply("v")
        step.reply(written)
        assert step.done and ctx.events.counts.snapshot()["evicted_leases"] == 0


def test_every_caller_gets_the_value_as_the_cache_holds_it() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    step.reply((1, "a"))  # a tuple: JSON reads it back as a list
    step.reply(Written.YES)
    assert step.result == [1, "a"]  # the leader gets what a hit will get
    step = Stepper(after_wait_timeout(make_ctx()[0]))
    step.reply((1, "a"))
    assert step.result == [1, "a"]  # so does an uncached load


def test_a_value_that_does_not_round_trip_is_refused_and_the_lease_released() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    assert step.reply([1.0, float("nan")]) == Release()
    with pytest.raises(SerializationError, match="NaN and infinity"):
        step.reply(None)


def test_a_corrupt_value_on_recheck_is_locked_over() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx))
    assert step.reply(AcquireReply(LockState.VALUE, b"garbage")) == Acquire(check_value=False)
    assert ctx.events.counts.snapshot()["corrupt_values"] == 1
    assert Stepper(fill(ctx, Miss.CORRUPT)).effect == Acquire(check_value=False)


def test_after_a_corrupt_value_a_holders_write_is_read_not_reloaded() -> None:
    ctx, _ = make_ctx()
    step = Stepper(fill(ctx, Miss.CORRUPT))
    assert step.reply(HELD) == Subscribe()  # another process is already replacing it
    assert step.reply(None) == Acquire(check_value=True)
    step.reply(HELD)
    assert step.reply(b"") == Acquire(check_value=True)  # written, too large to travel inline
    step.reply(AcquireReply(LockState.VALUE, envelope("fresh")))
    assert step.done and step.result == "fresh"


def test_large_values_are_not_sent_inline() -> None:
    ctx, _ = make_ctx(inline_value_limit=10)
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    assert not step.reply("x" * 100).inline


def test_after_wait_timeout_alone_is_the_in_process_waiters_policy() -> None:
    ctx, _ = make_ctx(on_wait_timeout="load")
    assert Stepper(after_wait_timeout(ctx)).effect == Load(leased=False)


# --- what the flow reports to observers (see _core.observer) ---------------------------


class Recorder:
    """An observer that keeps every report."""

    def __init__(self) -> None:
        self.reports: list[tuple[Any, ...]] = []

    def count(self, namespace: str, event: str, n: int) -> None:
        pass

    def began(self, namespace: str, measure: str) -> None:
        self.reports.append(("began", measure))

    def ended(self, namespace: str, measure: str, outcome: str, seconds: float) -> None:
        self.reports.append(("ended", measure, outcome, seconds))


def observed_ctx(**settings: Any) -> tuple[Context, Clock, Recorder]:
    ctx, clock = make_ctx(**settings)
    recorder = Recorder()
    ctx.events.add(recorder)  # type: ignore[attr-defined]
    return ctx, clock, recorder


def test_a_load_is_reported_with_its_outcome_and_duration() -> None:
    ctx, clock, recorder = observed_ctx()
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    clock.now += 0.25
    step.reply(None)  # the loader returned None: the null sentinel
    step.reply(True)
    assert recorder.reports == [("began", "load"), ("ended", "load", "none", 0.25)]


def test_a_load_that_raised_is_reported_as_an_error() -> None:
    ctx, clock, recorder = observed_ctx()
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    clock.now += 0.5
    assert step.fail(ZeroDivisionError()) == Release()
    with pytest.raises(ZeroDivisionError):
        step.reply(True)
    assert recorder.reports == [("began", "load"), ("ended", "load", "error", 0.5)]


def test_a_wait_woken_with_the_value_is_reported_from_its_first_sight_of_the_lease() -> None:
    ctx, clock, recorder = observed_ctx()
    step = Stepper(fill(ctx))
    step.reply(HELD)  # the wait begins
    step.reply(None)
    step.reply(HELD)
    clock.now += 0.003
    step.reply(envelope("v"))
    assert step.done and recorder.reports == [("began", "wait"), ("ended", "wait", "value", pytest.approx(0.003))]


def test_a_takeover_ends_the_wait_before_the_load_begins() -> None:
    ctx, clock, recorder = observed_ctx()
    step = Stepper(fill(ctx))
    step.reply(HELD)
    step.reply(None)
    step.reply(HELD)
    clock.now += 4
    step.reply(None)  # no message: the lease ran out
    step.reply(LOCKED)
    step.reply(None)  # settled: nothing came
    step.reply("mine")
    step.reply(True)
    assert [report[:3] for report in recorder.reports] == [
        ("began", "wait"),
        ("ended", "wait", "takeover"),
        ("began", "load"),
        ("ended", "load", "value"),
    ]
    assert recorder.reports[1][3] == 4


def test_a_wait_out_of_time_is_reported_as_a_timeout_then_the_uncached_load() -> None:
    ctx, clock, recorder = observed_ctx(wait_timeout=2)
    step = Stepper(fill(ctx))
    step.reply(HELD)
    step.reply(None)
    clock.now += 2
    assert step.reply(HELD) == Load(leased=False)
    step.reply("mine")
    assert [report[:3] for report in recorder.reports] == [
        ("began", "wait"),
        ("ended", "wait", "timeout"),
        ("began", "load"),
        ("ended", "load", "value"),
    ]


@pytest.mark.parametrize("interruption", [KeyboardInterrupt(), GeneratorExit()])
def test_an_interrupted_wait_still_ends_once(interruption: BaseException) -> None:
    ctx, _, recorder = observed_ctx()
    step = Stepper(fill(ctx))
    step.reply(HELD)
    step.reply(None)
    assert isinstance(step.reply(HELD), AwaitNotice)
    if isinstance(interruption, GeneratorExit):
        step.flow.close()
    else:
        with pytest.raises(KeyboardInterrupt):
            step.fail(interruption)
    assert [report[:3] for report in recorder.reports] == [("began", "wait"), ("ended", "wait", "error")]


def test_an_observer_that_raises_is_warned_about_and_the_flow_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    ctx, _ = make_ctx()

    class Broken(Recorder):
        def count(self, namespace: str, event: str, n: int) -> None:
            raise RuntimeError("exporter down")

    ctx.events.add(Broken())  # type: ignore[attr-defined]
    step = Stepper(fill(ctx))
    step.reply(LOCKED)
    step.reply("v")
    step.reply(True)
    assert step.done and step.result == "v" and ctx.events.counts.snapshot()["loads"] == 1  # type: ignore[attr-defined]
    assert "raised RuntimeError: exporter down" in caplog.text


def test_an_observer_without_the_three_methods_is_refused() -> None:
    from stampede import ConfigError

    ctx, _ = make_ctx()
    with pytest.raises(ConfigError, match="has no ended"):
        ctx.events.add(type("Half", (), {"count": lambda *a: None, "began": lambda *a: None})())  # type: ignore[attr-defined]


# --- the flow over a lease policy (``_core.leases``) ---------------------------------------


def test_on_redlock_the_flow_takes_the_majority_then_the_cache_key_and_releases_after_the_write() -> None:
    """One loop, one flow: the policy's steps are the flow's, composed with ``yield from``."""
    ctx, _ = make_ctx(jitter=0)
    ctx.leases = RedlockLeases(Quorum(3, 0.0)).bind(Lease(KEYS, "t", 9_000))
    servers = KEYS.on_lock_servers
    step = Stepper(fill(ctx))
    assert step.effect == ServersTake(servers, "t", 9_000)
    assert step.reply(Round(3, 0)) == Acquire(check_value=True)
    assert step.reply(LOCKED) == Load(leased=True)
    assert isinstance(step.reply({"a": 1}), WriteRelease)
    assert step.reply(Written.YES) == ServersRelease(servers, "t")  # after the write, which woke the waiters
    step.reply(Round(3, 0))
    assert step.done and step.result == {"a": 1}


def test_on_redlock_an_interrupted_take_releases_the_majority_and_the_cache_key() -> None:
    ctx, _ = make_ctx()
    ctx.leases = RedlockLeases(Quorum(3, 0.0)).bind(Lease(KEYS, "t", 9_000))
    servers = KEYS.on_lock_servers
    step = Stepper(fill(ctx))
    step.reply(Round(3, 0))
    assert step.fail(KeyboardInterrupt()) == ServersRelease(servers, "t")  # the policy's own undo
    assert step.reply(Round(3, 0)) == ServersRelease(servers, "t")  # then the flow's release, by token
    assert step.reply(Round(3, 0)) == Release()
    with pytest.raises(KeyboardInterrupt):
        step.reply(True)


def test_a_zookeeper_waiter_also_watches_the_holders_node() -> None:
    ctx, _ = make_ctx(wait_timeout=30, recheck_interval=10)
    ctx.leases = SessionLeases(Quorum(1, 0.0)).bind(Lease(KEYS, "t", 9_000))
    step = Stepper(fill(ctx))
    step.reply(Round(0, 0, lease_left=4.0))  # another holder's node is the lowest
    assert step.effect == ReadEntry()  # refused: a holder writes before it releases, so read
    assert step.reply((None, -1.0, False)) == Subscribe()
    assert step.reply(None) == ServersWatch(KEYS.on_lock_servers)  # a holder whose session ends wakes us


def test_lock_server_commands_never_count_as_producing_the_value() -> None:
    """Redlock releases its majority after the write: a caller who arrived during that
    release must not be handed the value written before it arrived (``_core.flight``)."""
    servers = KEYS.on_lock_servers
    for effect in (ServersTake(servers, "t", 1), ServersRelease(servers, "t"), ServersWatch(servers)):
        assert not produces_value(effect)
    assert produces_value(ReadValue()) and produces_value(ReadEntry()) and produces_value(Acquire())
