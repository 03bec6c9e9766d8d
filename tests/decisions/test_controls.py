"""The controls' and the timeouts' decisions, stepped by hand (``_core.controls``,
``_core.flow``): no server, no threads, no sleeping."""

from __future__ import annotations

import pytest

from stampede import Cached, LoadTimeout, SerializationError
from stampede._core.codec import identity
from stampede._core.controls import peeked, put, reload
from stampede._core.effects import Acquire, Finish, Load, LoadDetached, ReadValue, Release, Seize, WriteRelease
from stampede._core.flow import fill
from stampede._core.freshness import Stale
from stampede._core.store import Written

from .test_flow import CODEC, HELD, LOCKED, Stepper, envelope, make_ctx


def test_a_set_seizes_the_lease_then_writes_under_it() -> None:
    ctx, _ = make_ctx(ttl=60, jitter=0)
    step = Stepper(put(ctx, Cached({"a": 2}, ttl=5)))
    assert step.effect == Seize()
    write = step.reply(None)
    assert isinstance(write, WriteRelease) and write.ttl_ms == 5000
    assert CODEC.decode(write.envelope).value == {"a": 2}
    step.reply(Written.YES)
    assert step.done and step.result is True


def test_a_set_the_serializer_refuses_yields_nothing() -> None:
    ctx, _ = make_ctx()
    with pytest.raises(SerializationError):
        Stepper(put(ctx, {"a": object()}))


def test_an_interrupted_set_releases_the_lease_it_seized() -> None:
    ctx, _ = make_ctx()
    step = Stepper(put(ctx, 1))
    step.reply(None)  # seized
    assert step.fail(KeyboardInterrupt()) == Release()
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
