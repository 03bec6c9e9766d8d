"""Consistency measured in production (``verify_sample``): sampled hits are loaded again
in the background and counted as match, mismatch, superseded, error or skipped, over
every backend, blocking and asyncio, near and remote, one key and many."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

import stampede
from stampede import ConfigError, Stampede
from stampede._core.verify import RESULTS, VERIFICATIONS_AT_ONCE, Sample

from ..modes import Blocking, OnALoop
from ..scenarios import wait_until

TIMEOUT = 10.0


class Checks:
    """An observer of the consistency checks, and a way to wait for the next ones."""

    def __init__(self) -> None:
        self._done = threading.Condition()
        self.results: list[str] = []

    def count(self, namespace: str, event: str, n: int) -> None:
        if event.startswith("consistency_"):
            with self._done:
                self.results.extend([event.removeprefix("consistency_")] * n)
                self._done.notify_all()

    def began(self, namespace: str, measure: str) -> None:
        pass

    def ended(self, namespace: str, measure: str, outcome: str, seconds: float) -> None:
        pass

    def wait(self, count: int) -> list[str]:
        """The results once ``count`` checks have been counted (fails after TIMEOUT)."""
        with self._done:
            assert self._done.wait_for(lambda: len(self.results) >= count, TIMEOUT), self.results
            return list(self.results)


class Table:
    """Rows of the database a loader reads, counting the calls that are verifications."""

    def __init__(self) -> None:
        self.rows: dict[int, Any] = {}
        self.loads = 0
        self.verifications = 0
        self.during_verification: Callable[[], None] | None = None  # run inside a verification's call
        self.fail_verification = False
        self.hold: threading.Event | None = None  # a verification waits for this, if set
        self.entered = threading.Event()  # set when a verification's call begins

    def read(self, key: int) -> Any:
        if stampede.verifying():
            self.verifications += 1
            self.entered.set()
            if self.hold is not None:
                assert self.hold.wait(TIMEOUT)
            if self.during_verification is not None:
                self.during_verification()
            if self.fail_verification:
                raise RuntimeError("the database is down")
        else:
            self.loads += 1
        return self.rows.get(key)

    def loader(self, mode: Blocking | OnALoop) -> Callable[[int], Any]:
        if isinstance(mode, Blocking):
            return self.read

        async def aread(key: int) -> Any:
            if stampede.verifying() and self.hold is not None:
                self.entered.set()
                await asyncio.get_running_loop().run_in_executor(None, self.hold.wait, TIMEOUT)
            return self.read(key)

        return aread


@pytest.fixture
def checks() -> Checks:
    return Checks()


@pytest.fixture
def table() -> Table:
    table = Table()
    table.rows = {key: {"id": key, "name": f"row {key}"} for key in range(8)}
    return table


def verified_layer(make: Callable[..., Stampede], checks: Checks, **options: Any) -> Stampede:
    layer = make(verify_sample=1.0, verify_grace=0.05, **options)
    layer.observe(checks)
    return layer


def test_a_hit_that_agrees_with_the_loader_is_a_match_and_no_load(
    layer_of_each_backend: Callable[..., Stampede], table: Table, checks: Checks, mode: Blocking | OnALoop
) -> None:
    layer = verified_layer(layer_of_each_backend, checks)
    row = layer.cached_loader("row:{key}")(table.loader(mode))
    assert mode(row, 1) == table.rows[1]  # the miss: loaded, nothing verified
    assert mode(row, 1) == table.rows[1]  # a hit: verified
    assert checks.wait(1) == ["match"]
    assert (table.loads, table.verifications) == (1, 1)
    stats = layer.stats()
    assert (stats["loads"], stats["consistency_match"], stats["consistency_mismatch"]) == (1, 1, 0)


def test_a_hit_the_database_no_longer_agrees_with_is_a_mismatch_logged_by_template(
    layer_of_each_backend: Callable[..., Stampede],
    table: Table,
    checks: Checks,
    mode: Blocking | OnALoop,
    caplog: pytest.LogCaptureFixture,
) -> None:
    layer = verified_layer(layer_of_each_backend, checks)
    row = layer.cached_loader("row:{key}")(table.loader(mode))
    mode(row, 2)
    table.rows[2] = {"id": 2, "name": "renamed"}  # a write that does not invalidate
    with caplog.at_level(logging.WARNING, logger="stampede.cache"):
        assert mode(row, 2) == {"id": 2, "name": "row 2"}  # served, and verified
        assert checks.wait(1) == ["mismatch"]
    [record] = [record for record in caplog.records if "verified hit" in record.getMessage()]
    assert "row:{key}" in record.getMessage()
    assert row.key(2) not in record.getMessage()  # trace_keys is off: the key stays in the process
    assert record.stampede_outcome == "consistency_mismatch"  # type: ignore[attr-defined]
    assert layer.stats()["consistency_mismatch"] == 1


def test_a_mismatch_names_its_key_when_trace_keys_allows(
    make_layer: Callable[..., Stampede], table: Table, checks: Checks, caplog: pytest.LogCaptureFixture
) -> None:
    layer = verified_layer(make_layer, checks, trace_keys=True)
    row = layer.cached_loader("row:{key}")(table.read)
    row(3)
    table.rows[3] = "changed"
    with caplog.at_level(logging.WARNING, logger="stampede.cache"):
        row(3)
        assert checks.wait(1) == ["mismatch"]
    assert any(repr(row.key(3)) in record.getMessage() for record in caplog.records)


def test_an_entry_invalidated_while_it_is_verified_is_superseded_not_a_mismatch(
    layer_of_each_backend: Callable[..., Stampede], table: Table, checks: Checks, mode: Blocking | OnALoop
) -> None:
    layer = verified_layer(layer_of_each_backend, checks)
    row = layer.cached_loader("row:{key}")(table.loader(mode))
    mode(row, 4)

    def writer() -> None:  # the application's write path, between the hit and the verdict
        table.rows[4] = "new"
        mode(row.invalidate, 4)

    if isinstance(mode, OnALoop):  # the loop's verification holds while the test writes
        hold = table.hold = threading.Event()
        mode(row, 4)
        assert table.entered.wait(TIMEOUT)
        writer()
        hold.set()
    else:
        table.during_verification = writer
        mode(row, 4)
    assert checks.wait(1) == ["superseded"]
    assert mode(row, 4) == "new"


def test_a_writer_that_invalidates_within_verify_grace_gives_no_mismatch(
    make_layer: Callable[..., Stampede], table: Table, checks: Checks
) -> None:
    """A writer commits, then invalidates: a verification that loads between the two sees
    the new row while the entry still holds the old one. ``verify_grace`` waits for the
    invalidation on its way before counting a mismatch."""
    layer = make_layer(verify_sample=1.0, verify_grace=5.0)
    layer.observe(checks)
    row = layer.cached_loader("row:{key}")(table.read)
    row(5)
    invalidating: list[threading.Thread] = []

    def committed_not_yet_invalidated() -> None:
        table.rows[5] = "committed"
        later = threading.Timer(0.2, row.invalidate, args=(5,))
        invalidating.append(later)
        later.start()

    table.during_verification = committed_not_yet_invalidated
    row(5)
    assert checks.wait(1) == ["superseded"]
    invalidating[0].join(TIMEOUT)


def test_a_verification_that_fails_is_an_error_and_the_caller_never_sees_it(
    make_layer: Callable[..., Stampede], table: Table, checks: Checks, mode: Blocking | OnALoop
) -> None:
    layer = verified_layer(make_layer, checks)
    row = layer.cached_loader("row:{key}")(table.loader(mode))
    mode(row, 6)
    table.fail_verification = True
    assert mode(row, 6) == table.rows[6]
    assert checks.wait(1) == ["error"]


def test_verifications_beyond_the_limit_are_skipped_and_a_keys_hits_meanwhile_share_its_verdict(
    make_layer: Callable[..., Stampede], table: Table, checks: Checks, mode: Blocking | OnALoop
) -> None:
    layer = verified_layer(make_layer, checks)
    row = layer.cached_loader("row:{key}")(table.loader(mode))
    keys = list(range(VERIFICATIONS_AT_ONCE + 1))
    for key in keys:
        mode(row, key)
    hold = table.hold = threading.Event()
    try:
        for key in keys:  # the first ones are held in their verification; the last is over the limit
            mode(row, key)
        mode(row, 0)  # its key's verification is under way: this hit shares its verdict
        assert checks.wait(1) == ["skipped"]
    finally:
        hold.set()
    results = checks.wait(VERIFICATIONS_AT_ONCE + 2)
    assert sorted(results) == ["match"] * (VERIFICATIONS_AT_ONCE + 1) + ["skipped"]
    assert table.verifications == VERIFICATIONS_AT_ONCE


def places_held(layer: Stampede, mode: Blocking | OnALoop) -> int:
    """The verifications holding one of the ``VERIFICATIONS_AT_ONCE`` places now."""
    if isinstance(mode, Blocking):
        assert layer._runner is not None
        return layer._runner.state.verifier.running()
    runner = layer._async_runner
    assert runner is not None

    async def held() -> int:
        return runner._state().verifier.running()

    return mode(held)  # type: ignore[no-any-return]


def test_a_mismatch_waiting_its_grace_holds_no_place_so_matches_are_not_the_ones_skipped(
    make_layer: Callable[..., Stampede], table: Table, checks: Checks, mode: Blocking | OnALoop
) -> None:
    """A mismatch's verification waits ``verify_grace`` before its verdict; it held one of
    the four places all that time, so the hits sampled meanwhile were skipped, and they
    were mostly matches (the mismatching keys' hits joined their verifications): with a
    writer that left half the reads stale, 68-88% mismatches were reported. The wait asks
    nothing of the database and gives its place back."""
    layer = make_layer(verify_sample=1.0, verify_grace=6.0)  # a window for the fresh reads, stalls allowed
    layer.observe(checks)
    row = layer.cached_loader("row:{key}")(table.loader(mode))
    stale, fresh = range(VERIFICATIONS_AT_ONCE), range(VERIFICATIONS_AT_ONCE, 2 * VERIFICATIONS_AT_ONCE)
    for key in [*stale, *fresh]:
        mode(row, key)
    for key in stale:
        table.rows[key] = {"id": key, "name": "changed, not invalidated"}
    for key in stale:
        mode(row, key)  # each verification finds the database changed, and waits its grace
    waiting = lambda: table.verifications == len(stale) and places_held(layer, mode) == 0 and not checks.results  # noqa: E731
    wait_until(waiting, "mismatches waiting their grace, holding no place")
    for key in fresh:
        mode(row, key)  # a place each: verified, not skipped
    assert sorted(checks.wait(2 * VERIFICATIONS_AT_ONCE)) == ["match"] * 4 + ["mismatch"] * 4


def test_near_cache_hits_are_verified(make_layer: Callable[..., Stampede], table: Table, checks: Checks) -> None:
    layer = make_layer(near_cache=True)
    layer.observe(checks)
    unverified = layer.cached_loader("row:{key}")(table.read)
    for _ in range(200):  # until the near cache holds the entry (once its lease is held)
        before = layer.stats()["near_hits"]
        unverified(1)
        if layer.stats()["near_hits"] > before:
            break
    else:
        pytest.fail("no near hit")
    table.rows[1] = "changed"
    verified = layer.cached_loader("row:{key}", verify_sample=1.0, verify_grace=0.05)(table.read)
    near_hits = layer.stats()["near_hits"]
    assert verified(1) == {"id": 1, "name": "row 1"}
    assert layer.stats()["near_hits"] == near_hits + 1  # served from the near copy, and verified
    assert checks.wait(1) == ["mismatch"]


def test_many_key_hits_are_verified_one_per_call(
    layer_of_each_backend: Callable[..., Stampede], checks: Checks, mode: Blocking | OnALoop
) -> None:
    layer = verified_layer(layer_of_each_backend, checks)
    rows = {key: {"id": key} for key in range(10)}
    verified: list[list[int]] = []

    def read(keys: list[int]) -> dict[int, Any]:
        if stampede.verifying():
            verified.append(list(keys))
        return {key: rows[key] for key in keys}

    if isinstance(mode, Blocking):
        loader: Any = read
    else:

        async def loader(keys: list[int]) -> dict[int, Any]:
            return read(keys)

    page = layer.cached_loader_many("row:{key}")(loader)
    mode(page, list(range(10)))
    rows[7] = {"id": 7, "changed": True}
    assert mode(page, list(range(10))) == {key: {"id": key} for key in range(10)}  # every id a hit
    [result] = checks.wait(1)
    assert len(verified) == 1 and len(verified[0]) == 1  # one id of the page, loaded alone
    assert result == ("mismatch" if verified[0] == [7] else "match")


def test_a_comparator_decides_equality_when_the_loader_gives_one(
    make_layer: Callable[..., Stampede], table: Table, checks: Checks
) -> None:
    layer = verified_layer(make_layer, checks)
    same_id: Callable[[Any, Any], bool] = lambda served, loaded: served["id"] == loaded["id"]  # noqa: E731
    row = layer.cached_loader("row:{key}", verify_equal=same_id)(table.read)
    row(1)
    table.rows[1] = {"id": 1, "name": "only the name changed"}
    row(1)
    assert checks.wait(1) == ["match"]


def test_a_null_hit_is_verified_too(make_layer: Callable[..., Stampede], table: Table, checks: Checks) -> None:
    layer = verified_layer(make_layer, checks)
    row = layer.cached_loader("row:{key}")(table.read)
    assert row(99) is None  # the null sentinel
    row(99)
    assert checks.wait(1) == ["match"]
    table.rows[99] = "now it exists"
    row(99)
    assert checks.wait(2) == ["match", "mismatch"]


def test_verification_is_off_by_default_and_costs_no_load(make_layer: Callable[..., Stampede], table: Table) -> None:
    layer = make_layer()
    row = layer.cached_loader("row:{key}")(table.read)
    for _ in range(100):
        row(1)
    assert (table.loads, table.verifications) == (1, 0)
    assert all(layer.stats()[f"consistency_{result}"] == 0 for result in RESULTS)


@pytest.mark.parametrize(
    "setting",
    [{"verify_sample": -0.1}, {"verify_sample": 1.5}, {"verify_sample": "0.1"}, {"verify_grace": -1}],
)
def test_bad_verification_settings_are_refused_when_given(setting: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Stampede(**setting)


def test_a_comparator_that_is_not_callable_is_refused(make_layer: Callable[..., Stampede]) -> None:
    with pytest.raises(ConfigError, match="verify_equal"):
        make_layer().cached_loader("row:{key}", verify_equal="yes")  # type: ignore[arg-type]


def test_the_sample_takes_the_rate_of_hits_asked() -> None:
    rates = {0.001: 1_000_000, 0.1: 100_000}
    for rate, hits in rates.items():
        sample = Sample(rate, random.Random(7).random)
        due = sum(sample.due() for _ in range(hits))
        assert abs(due - rate * hits) < 5 * (rate * hits) ** 0.5, (rate, due)
    always = Sample(1.0)
    assert all(always.due() for _ in range(10))


def test_the_sample_picks_one_hit_of_a_page_at_the_rate_of_hits() -> None:
    sample = Sample(0.01, random.Random(3).random)
    picked = [sample.among(50) for _ in range(20_000)]
    due = [position for position in picked if position >= 0]
    assert all(0 <= position < 50 for position in due)
    expected = 20_000 * (1 - 0.99**50)  # a page with one hit due or more: one is verified
    assert abs(len(due) - expected) < 5 * expected**0.5
    assert len(set(due)) == 50  # any position may be picked
