"""The controls' and the timeouts' decisions, stepped by hand (``_core.controls``,
``_core.flow``): no server, no threads, no sleeping."""

from __future__ import annotations

import pytest

from stampede import Cached, LoadTimeout, SerializationError
from stampede._core.codec import identity
from stampede._core.controls import peeked, put, reload
from stampede._core.effects import (
    Acquire,
    Finish,
    Lease,
    Load,
    LoadDetached,
    Put,
    ReadValue,
    Release,
    Seize,
    ServersDrop,
    ServersRelease,
    ServersTake,
    WriteRelease,
)
from stampede._core.flow import fill
from stampede._core.freshness import Stale
from stampede._core.majority import Quorum, RedlockLeases
from stampede._core.store import Round, Written

from .test_flow import CODEC, HELD, KEYS, LOCKED, Stepper, envelope, make_ctx


def test_a_set_on_one_server_is_one_step_the_seizure_and_the_write() -> None:
    """One ``Put``: no moment where the entry is absent, and no lease to clean up."""
    ctx, _ = make_ctx(ttl=60, jitter=0)
    step = Stepper(put(ctx, Cached({"a": 2}, ttl=5)))
    assert isinstance(step.effect, Put) and step.effect.ttl_ms == 5000 and step.effect.tagged is None
    assert CODEC.decode(step.effect.envelope).value == {"a": 2}
    step.reply(Written.YES)
    assert step.done and step.result is True
    assert ctx.events.counts.snapshot()["sets"] == 1


def test_a_set_a_tag_refuses_is_counted_overtaken() -> None:
    ctx, _ = make_ctx()
    step = Stepper(put(ctx, 1))
    step.reply(Written.REFUSED)
    assert step.done and step.result is False
    assert ctx.events.counts.snapshot()["sets_overtaken"] == 1


def test_a_set_with_redlock_leases_seizes_the_lease_then_writes_under_it() -> None:
    ctx, _ = make_ctx(ttl=60, jitter=0)
    ctx.leases = RedlockLeases(Quorum(3, 0.0)).bind(Lease(KEYS, "t", 9_000))
    servers = KEYS.on_lock_servers
    step = Stepper(put(ctx, 7))
    assert step.effect == ServersDrop(servers)
    assert isinstance(step.reply(None), ServersTake)
    assert step.reply(Round(3, 0)) == Seize()
    write = step.reply(None)
    assert isinstance(write, WriteRelease) and CODEC.decode(write.envelope).value == 7
    assert step.reply(Written.YES) == ServersRelease(servers, "t")  # the majority, once written
    step.reply(Round(3, 0))
    assert step.done and step.result is True


def test_a_set_the_serializer_refuses_yields_nothing() -> None:
    ctx, _ = make_ctx()
    with pytest.raises(SerializationError):
        Stepper(put(ctx, {"a": object()}))


def test_an_interrupted_set_releases_the_lease_it_seized() -> None:
    """Where the seizure and the write are two steps (Redlock), an interruption between
    them releases the lease on the lock servers and the cache server."""
    ctx, _ = make_ctx()
    ctx.leases = RedlockLeases(Quorum(3, 0.0)).bind(Lease(KEYS, "t", 9_000))
    servers = KEYS.on_lock_servers
    step = Stepper(put(ctx, 1))
    step.reply(None)
    step.reply(Round(3, 0))
    assert isinstance(step.reply(None), WriteRelease)  # seized
    assert step.fail(KeyboardInterrupt()) == ServersRelease(servers, "t")  # the write's own cleanup
    assert step.reply(Round(3, 0)) == ServersRelease(servers, "t")  # then the set's: both
    assert step.reply(Round(0, 0)) == Release()
    with pytest.raises(KeyboardInterrupt):
        step.reply(True)


def test_a_refresh_takes_the_lease_over_the_value_it_read() -> None:
    ctx, _ = make_ctx()
    current = envelope({"a": 1})
    step = Stepper(reload(ctx))
    assert step.effect == ReadValue()
    assert step.reply(current) == Acquire(check_value=True, stale=identity(current))
    load = step.reply(LOCKED)
    assert isinstance(load, Load) and load.leased and load.previous is not None
    assert load.previous.raw == current and load.previous.value == {"a": 1}  # for its loader to keep


def test_peek_reports_fresh_stale_and_nothing() -> None:
    ctx, _ = make_ctx(ttl=60, stale_while_revalidate=10)
    value = CODEC.encode({"a": 1}, 1.0, 0.5, key="k", stale_for=10)
    assert peeked(value, 30.0, False, CODEC, ctx.settings) == ({"a": 1}, False)
    assert peeked(value, 5.0, False, CODEC, ctx.settings) == ({"a": 1}, True)
    assert peeked(None, -1.0, False, CODEC, ctx.settings) is None
    assert peeked(b"garbage", 30.0, False, CODEC, ctx.settings) is None


def test_a_load_past_load_timeout_goes_on_and_its_caller_gets_load_timeout() -> None:
    ctx, _ = make_ctx(load_timeout=2, cancel_on_timeout=False)
    step = Stepper(fill(ctx))
    assert step.reply(LOCKED) == Load(leased=True, timeout=2, detach=True)
    finish = step.fail(LoadDetached("pending"))
    assert isinstance(finish, Finish) and finish.pending == "pending"
    with pytest.raises(LoadTimeout, match="load_timeout=2"):
        step.reply(None)
    assert ctx.unwritten  # joiners of a value would start over

    late = Stepper(finish.then({"a": 1}, None))  # the load ended: written under its lease
    assert isinstance(late.effect, WriteRelease)
    late.reply(Written.YES)
    assert late.done


def test_a_waiter_gives_up_at_load_timeout_without_loading() -> None:
    ctx, clock = make_ctx(load_timeout=2)
    step = Stepper(fill(ctx))
    step.reply(HELD)  # subscribes
    step.reply(None)  # re-checks
    clock.now += 2.5
    with pytest.raises(LoadTimeout):
        step.reply(HELD)


def test_a_soft_timeout_serves_the_stale_value_in_hand() -> None:
    ctx, _ = make_ctx(stale_if_error=60, load_soft_timeout=0.5, load_timeout=5)
    stale = Stale({"old": 1}, b"id", on_error=True)
    step = Stepper(fill(ctx, stale))
    assert step.reply(LOCKED) == Load(leased=True, timeout=0.5, detach=True)  # never cancelled
    assert isinstance(step.fail(LoadDetached("pending")), Finish)
    step.reply(None)
    assert step.done and step.result == {"old": 1}
    assert ctx.served_stale
