"""One call's decisions (``_core.call``), stepped by hand: join or lead, what to read, what
a read means, when to start over. No server, no threads, no sleeping."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from stampede import BackendUnavailable
from stampede._core.call import (
    READ,
    READ_FOR_NEAR,
    READ_WITH_TTL,
    READ_WITH_TTL_FAILING,
    REPORT_STALE,
    AwaitFlight,
    Drive,
    StartRefresh,
    call,
)
from stampede._core.codec import Codec
from stampede._core.config import Settings
from stampede._core.effects import Acquire
from stampede._core.flow import LoaderSpec
from stampede._drivers.observe import Events, RateLimitedLog
from stampede._drivers.singleflight import FlightTable

from .test_flow import Stepper

CODEC = Codec()
KEY = "t:{item:1}"
WARN = RateLimitedLog(logging.getLogger("test"))


def spec(**settings: Any) -> LoaderSpec:
    return LoaderSpec(lambda: None, Settings(**settings), CODEC)


def start(table: FlightTable, loader: LoaderSpec, near: bool = False) -> Stepper:
    return Stepper(call(KEY, loader, table, Events("test", WARN), WARN, near))


def envelope(value: Any, stale_for: float = 0.0) -> bytes:
    return CODEC.encode(value, 1_700_000_000.0, 0.01, key=KEY, stale_for=stale_for)


def test_a_leader_reads_once_and_a_hit_closes_its_flight() -> None:
    table = FlightTable()
    leader = start(table, spec())
    assert leader.effect == READ
    assert leader.reply(envelope({"v": 1})) is None
    assert leader.done and leader.result == {"v": 1}
    assert table.join(KEY)[1] is True  # the flight closed: the next caller leads


@pytest.mark.parametrize(
    ("settings", "near", "read"),
    [
        ({}, False, READ),
        ({"stale_while_revalidate": 5}, False, READ_WITH_TTL),
        ({"stale_if_error": 5}, False, READ_WITH_TTL_FAILING),
    ],
)
def test_what_a_leader_reads_follows_the_settings(settings: dict[str, Any], near: bool, read: Any) -> None:
    assert start(FlightTable(), spec(**settings), near).effect == read


def test_a_leader_filling_the_near_cache_reads_for_it() -> None:
    assert start(FlightTable(), spec(near_cache=True), near=True).effect == READ_FOR_NEAR


def test_a_miss_drives_the_fill_flow_with_the_flight_and_shares_its_value() -> None:
    table = FlightTable()
    leader = start(table, spec())
    leader.reply(None)
    drive = leader.effect
    assert isinstance(drive, Drive) and drive.flight is not None
    assert next(drive.flow) == Acquire(check_value=True)  # the fill flow takes the lease
    joined, leads = table.join(KEY)
    assert joined is drive.flight and leads is False
    leader.reply("loaded")
    assert leader.result == "loaded" and joined.value == "loaded"
    assert table.wait(joined, 0) is True  # the joiner was woken


def test_a_failed_first_read_drives_the_failure_policy() -> None:
    leader = start(FlightTable(), spec(on_backend_error="load"))
    effect = leader.fail(BackendUnavailable("down"))
    assert isinstance(effect, Drive) and effect.flight is not None


def test_a_joiner_waits_at_most_the_wait_timeout_then_drives_the_timeout_policy() -> None:
    table = FlightTable()
    leader = start(table, spec())
    leader.reply(None)  # loading (a call closed unfinished finishes its flight: keep it)
    joiner = start(table, spec(wait_timeout=2.5))
    assert isinstance(joiner.effect, AwaitFlight)
    assert 2.4 < joiner.effect.timeout <= 2.5
    effect = joiner.reply(False)
    assert isinstance(effect, Drive) and effect.flight is None


def test_a_joiner_shares_the_leaders_value() -> None:
    table = FlightTable()
    leader = start(table, spec())
    leader.reply(None)
    joiner = start(table, spec())
    assert isinstance(leader.effect, Drive) and leader.effect.flight is not None
    leader.effect.flight.count(Acquire(check_value=True))  # as the driver counts the flow's commands
    leader.reply("loaded")
    assert joiner.reply(True) is None and joiner.result == "loaded"


class Interrupted(BaseException):
    pass


def test_an_interrupted_leader_closes_its_flight_and_its_joiner_starts_over_and_leads() -> None:
    table = FlightTable()
    leader = start(table, spec())
    leader.reply(None)
    joiner = start(table, spec())
    with pytest.raises(Interrupted):
        leader.fail(Interrupted())
    assert joiner.reply(True) == READ  # started over: it leads, and reads afresh


def test_a_leaders_exception_is_shared_with_its_joiners() -> None:
    table = FlightTable()
    leader = start(table, spec())
    leader.reply(None)
    joiner = start(table, spec())
    with pytest.raises(ValueError):
        leader.fail(ValueError("db"))
    with pytest.raises(ValueError):
        joiner.reply(True)


def test_a_joiner_who_arrived_after_the_read_was_sent_starts_over() -> None:
    """A value read by a GET sent before the joiner arrived may predate an invalidation
    that completed before it arrived (see ``_core.flight``)."""
    table = FlightTable()
    leader = start(table, spec())  # its GET is on the wire
    joiner = start(table, spec())
    leader.reply(envelope("old"))
    assert joiner.reply(True) == READ


def test_a_stale_value_starts_a_refresh_and_is_reported_stale() -> None:
    leader = start(FlightTable(), spec(ttl=1, stale_while_revalidate=30))
    raw = envelope("old", stale_for=30)
    effect = leader.reply((raw, 20.0, False))  # 20 s left of the 30 s past ttl: stale
    assert isinstance(effect, StartRefresh) and not effect.early
    assert leader.reply(None) == REPORT_STALE
    leader.reply(None)
    assert leader.result == "old"
