"""One call's decisions around its flight (``_core/call.py``): stepped by hand, on a fake
clock, with no server, no thread and no sleeping."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from stampede import RecursiveLoad
from stampede._core.call import DECIDED, MISSES, Joiner, Outcome, read_found
from stampede._core.codec import Codec
from stampede._core.config import Settings
from stampede._core.flight import Flight, loading
from stampede._core.flow import LoaderSpec, Miss
from stampede._core.freshness import Served, Stale
from stampede._core.observer import Measure
from stampede._drivers.observe import Events, RateLimitedLog

CODEC = Codec()
WARN = RateLimitedLog(logging.getLogger("test"))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Heard:
    """An observer that keeps every wait's outcome."""

    def __init__(self) -> None:
        self.waits: list[str] = []

    def count(self, namespace: str, name: str, n: int) -> None:
        pass

    def began(self, namespace: str, measure: Measure) -> None:
        pass

    def ended(self, namespace: str, measure: Measure, outcome: str, seconds: float) -> None:
        self.waits.append(outcome)


def spec(**settings: Any) -> LoaderSpec:
    return LoaderSpec(lambda: None, Settings(**settings), CODEC)


def observed() -> tuple[Events, Heard]:
    events = Events("test", WARN)
    heard = Heard()
    events.add(heard)
    return events, heard


def flight(sent: int = 1, value: object = "v", error: BaseException | None = None, unwritten: bool = False) -> Flight:
    done = Flight()
    done.sent, done.value, done.error, done.unwritten, done.codec = sent, value, error, unwritten, CODEC
    return done


def test_a_joiner_shares_the_value_of_a_flight_it_joined_before_the_value_was_produced() -> None:
    events, heard = observed()
    joiner = Joiner("k", spec(wait_timeout=5.0), events, Clock())
    joining = flight(sent=1)
    assert joiner.joins(joining) == 5.0
    joining.sent = 3  # the load's write went out after the joiner arrived
    assert joiner.outcome(joining, joined=True) == "v"
    assert heard.waits == ["value"]
    assert events.counts.snapshot()["collapsed"] == 1


def test_a_value_read_before_the_joiner_arrived_sends_it_back_early_for_every_flight() -> None:
    events, heard = observed()
    joiner = Joiner("k", spec(), events, Clock())
    joiner.joins(flight(sent=1))  # the GET was on the wire already
    assert joiner.outcome(flight(sent=1), joined=True) is Outcome.START_OVER
    assert joiner.early
    joiner.joins(flight(sent=1))
    assert joiner.outcome(flight(sent=1), joined=True) == "v"  # early: it shares now
    assert heard.waits == ["value"]  # one wait across the start-over


def test_the_deadline_is_set_once_and_starting_over_does_not_extend_it() -> None:
    clock = Clock()
    joiner = Joiner("k", spec(wait_timeout=2.0), Events("test", WARN), clock)
    assert joiner.joins(flight(sent=1)) == 2.0
    clock.now += 1.5
    assert joiner.joins(flight(sent=1)) == pytest.approx(0.5)
    clock.now += 1.0
    assert joiner.joins(flight(sent=1)) == 0.0  # never negative


def test_a_wait_that_runs_out_ends_as_a_timeout() -> None:
    events, heard = observed()
    joiner = Joiner("k", spec(), events, Clock())
    joiner.joins(flight())
    assert joiner.outcome(flight(), joined=False) is Outcome.TIMED_OUT
    assert heard.waits == ["timeout"]


def test_an_interrupted_leader_or_a_refused_write_sends_joiners_back() -> None:
    joiner = Joiner("k", spec(), Events("test", WARN), Clock())
    for done in (flight(sent=2, error=KeyboardInterrupt()), flight(sent=3, unwritten=True)):
        joiner.joins(done)
        assert joiner.outcome(done, joined=True) is Outcome.START_OVER


def test_the_leaders_exception_is_raised_to_the_joiner_and_its_wait_ends_in_error() -> None:
    events, heard = observed()
    joiner = Joiner("k", spec(), events, Clock())
    failed = flight(sent=2, error=LookupError("down"))
    joiner.joins(failed)
    with pytest.raises(LookupError, match="down"):
        joiner.outcome(failed, joined=True)
    assert heard.waits == ["error"]


def test_a_joiner_that_leads_after_starting_over_ends_its_wait_as_a_retry() -> None:
    events, heard = observed()
    joiner = Joiner("k", spec(), events, Clock())
    joiner.joins(flight(sent=1))
    assert joiner.outcome(flight(sent=1), joined=True) is Outcome.START_OVER
    joiner.leads()
    joiner.interrupted()  # a second way out reports nothing more
    assert heard.waits == ["retry"]


def test_a_call_from_inside_its_own_load_is_refused_before_any_wait_begins() -> None:
    events, heard = observed()
    with loading("k"), pytest.raises(RecursiveLoad):
        Joiner("k", spec(), events, Clock())
    assert heard.waits == []


def test_the_first_read_decides_a_hit_the_null_sentinel_and_a_miss() -> None:
    events = Events("test", WARN)
    plain = spec()
    hit, null = CODEC.encode({"a": 1}, 1.0, 0.0, key="k"), CODEC.encode(None, 1.0, 0.0, key="k")
    for raw, expected in ((hit, {"a": 1}), (null, None)):
        leading = Flight()
        found = read_found(leading, plain, raw, -1.0, False, events, WARN, "k", lambda: 0.5)
        assert found == expected
        assert type(found) not in DECIDED  # the driver returns it as it is
        assert leading.raw == raw
    for raw, miss in ((None, Miss.ABSENT), (b"\x00garbage", Miss.CORRUPT)):
        found = read_found(Flight(), plain, raw, -1.0, False, events, WARN, "k", lambda: 0.5)
        assert found is miss
        assert isinstance(found, MISSES) and type(found) in DECIDED
    assert events.counts.snapshot()["hits"] == 1
    assert events.counts.snapshot()["null_hits"] == 1
    assert events.counts.snapshot()["misses"] == 2


def test_a_read_past_its_ttl_is_served_stale_and_marks_the_flight_stale() -> None:
    events = Events("test", WARN)
    revalidating = spec(ttl=1.0, stale_while_revalidate=10.0)
    raw = CODEC.encode("old", 1.0, 0.0, key="k", stale_for=10.0)
    leading = Flight()
    found = read_found(leading, revalidating, raw, 5.0, False, events, WARN, "k", lambda: 0.5)  # 5 s past ttl
    assert isinstance(found, Served) and type(found) in DECIDED
    assert (found.value, found.stale, found.refresh is not None) == ("old", True, True)
    assert leading.stale
    assert events.counts.snapshot()["stale_hits"] == 1


def test_a_read_past_every_grace_is_a_stale_value_for_the_miss_path() -> None:
    events = Events("test", WARN)
    failing_over = spec(ttl=1.0, stale_if_error=10.0)
    raw = CODEC.encode("old", 1.0, 0.0, key="k", stale_for=10.0)
    leading = Flight()
    found = read_found(leading, failing_over, raw, 5.0, False, events, WARN, "k", lambda: 0.5)  # not failing
    assert isinstance(found, Stale)
    assert isinstance(found, MISSES) and type(found) in DECIDED
    assert (found.value, found.on_error) == ("old", True)
    assert not leading.stale
