"""The store contract (``stampede._core.store.Store``): what every backend must do, the same
tests over each of them, blocking and asyncio: leases, fenced writes, invalidation,
wake-ups, renewal, named locks. A backend passes it unchanged (docs/development.md).

Run it over a backend from a test module of your own, with pytest::

    from stampede.testing.contract import *  # the contract's tests and fixtures

    @pytest.fixture
    def contract_layer():
        def make(**options):
            return Stampede(backend=my_backend, **options)  # closed by the caller's fixture
        return make

``contract_layer`` makes a ``Stampede`` over the backend, taking layer options
(``namespace=``): built with ``backend=`` (``stampede.backends``), or from a URL. The
suite asks for its blocking store and one event loop's store (``layer.store()``,
``layer.loop_store()``), and sees each through ``contract_view`` (as it is, unless that fixture is overridden: a
layer whose leases are also held elsewhere, by a lease policy, is checked through a view
whose leased methods are the policy's decisions).
Call ``pytest.register_assert_rewrite("stampede.testing.contract")`` in your
conftest.py first, so that a failed assertion shows its values.

The asyncio stores are driven through ``OnLoop``, which runs each awaited method on an
event loop in a thread of its own, so one test body serves both.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stampede import BackendUnavailable, ConfigError, Stampede
from stampede._core.codec import Codec
from stampede._core.keys import EntryKeys, budget_keys, lock_keys
from stampede._core.store import GRANTED, LEASE_GONE, TRACE_MARK, AcquireReply, LockState, Roles, Written, roles_of
from stampede._core.tags import Tagged, TagKeys, TagSet, clock_key
from stampede._core.versions import saw_versions, versions_seen

__all__ = [  # what a star import takes: the fixtures and every test
    "contract_view",
    "keys",
    "store",
    "test_a_free_lease_is_taken_and_a_second_caller_sees_it_held",
    "test_the_holders_write_is_stored_releases_the_lease_and_is_found_on_acquire",
    "test_a_refused_caller_is_told_only_a_traced_holders_token",
    "test_a_write_without_the_lease_is_refused_and_writes_nothing",
    "test_an_invalidation_drops_value_and_lease_and_refuses_the_holders_write",
    "test_a_put_replaces_the_value_and_any_holders_lease_in_one_step",
    "test_a_versioned_loaders_mark_is_reported_by_every_step_that_invalidates_the_entry",
    "test_a_tagged_put_joins_its_tag_unless_the_tag_was_invalidated_since",
    "test_renewal_extends_only_the_holders_lease",
    "test_a_lease_nobody_renews_runs_out_and_is_taken_over",
    "test_release_is_by_token",
    "test_a_corrupt_value_can_be_locked_over",
    "test_waiters_are_woken_with_the_value_or_to_recheck",
    "test_named_locks_draw_growing_fences_and_queue_fairly",
    "test_a_budgets_slots_go_to_its_size_of_holders_then_to_waiters_in_arrival_order",
    "test_a_slot_nobody_renews_runs_out_and_a_waiter_who_stops_trying_loses_its_place",
    "test_a_hot_set_counts_its_members_keeps_the_most_counted_and_runs_out",
    "test_a_released_slot_is_handed_to_the_first_waiter_in_line_and_only_it_is_woken",
    "test_a_slot_for_an_entry_goes_to_its_waiter_only_while_the_entrys_lease_is_its_own",
    "test_scan_lists_the_entries_of_a_namespace_and_check_passes",
    "test_a_value_is_read_with_the_seconds_the_store_keeps_it",
    "test_the_lease_is_taken_over_a_stale_value_only_while_it_is_still_that_one",
    "test_a_failed_loads_hold_keeps_everyone_out_and_says_so",
    "test_expire_keeps_the_value_for_its_stale_window_and_drops_the_lease",
    "test_a_hold_marks_the_entry_failing_until_a_write_an_invalidation_or_an_expire",
    "test_many_key_commands_answer_each_entry_as_its_single_key_command_does",
    "test_a_tagged_write_joins_its_tag_and_the_tags_invalidation_drops_it",
    "test_a_tagged_write_of_a_load_begun_before_its_tags_invalidation_is_refused",
    "test_a_soft_tag_invalidation_keeps_stale_values_as_members",
    "test_a_lease_taken_with_the_tag_clock_reads_it_as_a_load_about_to_begin",
    "test_a_runs_relay_hands_out_its_records_in_order_from_any_place",
    "test_a_relay_read_waits_for_the_next_record",
    "test_a_relay_runs_out_after_its_linger_and_never_reads_from_its_middle",
]
LEASE_MS = 5_000
ENVELOPE = Codec().encode({"v": 1}, 1.0, 0.0, key="k")


class OnLoop:
    """An ``AsyncStore`` used as a blocking ``Store``: each call runs on ``loop``."""

    def __init__(self, store: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._store, self._loop = store, loop

    def _call(self, name: str, *args: Any, **options: Any) -> Any:
        async def call() -> tuple[Any, list[str]]:
            with versions_seen() as seen:  # reported on the loop: told again here
                return await getattr(self._store, name)(*args, **options), seen

        result, seen = asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=20)
        for value_key in seen:
            saw_versions(value_key)
        return result

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name == "subscribe":
            return lambda keys: OnLoopSubscription(self._call("subscribe", keys), self._loop)
        if name == "subscribe_many":
            return lambda keys: [
                each if isinstance(each, BaseException) else OnLoopSubscription(each, self._loop)
                for each in self._call(name, keys)
            ]
        attribute = getattr(self._store, name)
        if not callable(attribute):  # the roles the store says it has (optional_roles)
            return attribute  # type: ignore[no-any-return]
        return lambda *args, **options: self._call(name, *args, **options)


class OnLoopSubscription:
    def __init__(self, subscription: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._subscription, self._loop = subscription, loop

    def wait(self, timeout: float) -> bytes | None:
        future = asyncio.run_coroutine_threadsafe(self._subscription.wait(timeout), self._loop)
        return future.result(timeout=timeout + 20)  # type: ignore[no-any-return]

    def close(self) -> None:
        async def close() -> None:
            self._subscription.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=20)


@pytest.fixture
def contract_view() -> Callable[[Stampede, Any], Any]:
    """How the suite sees a layer's store, given the layer and the store: as it is.
    Override it to run the contract over a store seen through something else, as this
    project's suite does over the lease policies of Redlock and ZooKeeper layers. It is
    called in the event loop of an asyncio store."""
    return lambda layer, store: store


@pytest.fixture(params=["blocking", "asyncio"])
def store(
    request: pytest.FixtureRequest,
    contract_layer: Callable[..., Stampede],
    contract_view: Callable[[Stampede, Any], Any],
) -> Iterator[Any]:
    layer = contract_layer(namespace="contract")
    if request.param == "blocking":
        yield contract_view(layer, layer.store())
        return
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def loop_store() -> Any:
        return contract_view(layer, layer.loop_store())

    try:
        yield OnLoop(asyncio.run_coroutine_threadsafe(loop_store(), loop).result(timeout=20), loop)
    finally:
        asyncio.run_coroutine_threadsafe(layer.aclose(), loop).result(timeout=20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=20)
        loop.close()


@pytest.fixture
def keys() -> EntryKeys:
    return EntryKeys.for_value(f"contract:{{item:{uuid.uuid4().hex}}}")


def test_a_free_lease_is_taken_and_a_second_caller_sees_it_held(store: Any, keys: EntryKeys) -> None:
    assert store.get(keys.value) is None
    assert store.acquire(keys, "a", LEASE_MS, True).state is LockState.LOCKED
    held: AcquireReply = store.acquire(keys, "b", LEASE_MS, True)
    assert held.state is LockState.HELD and 0 < held.lease_left <= LEASE_MS / 1000
    assert store.holder(keys) == "a"


def test_the_holders_write_is_stored_releases_the_lease_and_is_found_on_acquire(store: Any, keys: EntryKeys) -> None:
    store.acquire(keys, "a", LEASE_MS, True)
    assert store.write_release(keys, "a", ENVELOPE, 60_000, True) == Written.YES
    assert store.get(keys.value) == ENVELOPE
    assert store.holder(keys) is None
    assert store.acquire(keys, "b", LEASE_MS, True) == AcquireReply(LockState.VALUE, ENVELOPE)


def test_a_refused_caller_is_told_only_a_traced_holders_token(store: Any, keys: EntryKeys) -> None:
    """``AcquireReply.holder``: a holder's token leaves the store only if it carries a
    trace (holds ``TRACE_MARK``), for a waiter's span to link to; a store that does not
    tell (lock servers that only refuse) answers "" for both."""
    store.acquire(keys, "a", LEASE_MS, True)
    assert store.acquire(keys, "b", LEASE_MS, True).holder == ""
    traced_keys = EntryKeys.for_value(f"contract:{{item:{uuid.uuid4().hex}}}")
    traced = f"a{TRACE_MARK}{'0' * 50}"
    store.acquire(traced_keys, traced, LEASE_MS, True)
    assert store.acquire(traced_keys, "b", LEASE_MS, True).holder in (traced, "")


def test_a_write_without_the_lease_is_refused_and_writes_nothing(store: Any, keys: EntryKeys) -> None:
    store.acquire(keys, "a", LEASE_MS, True)
    assert store.write_release(keys, "b", ENVELOPE, 60_000, True) != Written.YES
    assert store.get(keys.value) is None
    assert store.holder(keys) == "a"


def test_an_invalidation_drops_value_and_lease_and_refuses_the_holders_write(store: Any, keys: EntryKeys) -> None:
    store.acquire(keys, "a", LEASE_MS, True)
    store.invalidate(keys)
    assert store.holder(keys) is None
    assert store.write_release(keys, "a", ENVELOPE, 60_000, True) == Written.REFUSED
    assert store.get(keys.value) is None
    assert store.acquire(keys, "b", LEASE_MS, True).state is LockState.LOCKED  # a waiter takes over at once


def test_a_seizure_invalidates_takes_the_lease_and_refuses_the_old_holders_write(store: Any, keys: EntryKeys) -> None:
    store.acquire(keys, "a", LEASE_MS, True)
    store.seize(keys, "b", LEASE_MS)
    assert store.holder(keys) == "b"
    assert store.write_release(keys, "a", b"old", 60_000, True) == Written.REFUSED
    assert store.acquire(keys, "c", LEASE_MS, True).state is LockState.HELD  # a waiter finds it taken
    assert store.write_release(keys, "b", ENVELOPE, 60_000, True) == Written.YES
    assert store.get(keys.value) == ENVELOPE
    store.seize(keys, "d", LEASE_MS)  # over a value: it goes
    assert store.get(keys.value) is None
    assert store.release(keys, "d") is True


def test_a_put_replaces_the_value_and_any_holders_lease_in_one_step(store: Any, keys: EntryKeys) -> None:
    """``put`` (a ``set``): the value is written over the old one, a holder's load is
    refused its write, the waiters are woken (with the value, when it travels), and no
    lease is left."""
    store.acquire(keys, "a", LEASE_MS, True)  # a load in flight
    subscription = store.subscribe(keys)
    try:
        assert store.put(keys, "c", LEASE_MS, ENVELOPE, 60_000, True) == Written.YES
        assert store.get(keys.value) == ENVELOPE and store.holder(keys) is None
        assert store.write_release(keys, "a", b"stale", 60_000, True) == Written.REFUSED  # overtaken
        assert store.get(keys.value) == ENVELOPE
        # The waiters' wake-up: the value, or b"" to read it; a store may send another
        # message first (wake them twice), so two are read at most, and no more than it takes.
        woken = [subscription.wait(5)]
        if woken[0] not in (ENVELOPE, b""):
            woken.append(subscription.wait(5))
        assert ENVELOPE in woken or b"" in woken, woken
    finally:
        subscription.close()
    assert store.put(keys, "d", LEASE_MS, b"newer", 60_000, False) == Written.YES  # over a value
    assert store.get(keys.value) == b"newer" and store.holder(keys) is None
    assert store.acquire(keys, "e", LEASE_MS, True).state is LockState.VALUE


def test_a_versioned_loaders_mark_is_reported_by_every_step_that_invalidates_the_entry(
    store: Any, keys: EntryKeys
) -> None:
    """A loader with ``version=`` marks the entry of the loader without it before it loads
    (``mark_versioned``); that entry's invalidate, expire, seizure and put report the mark
    (``_core.versions.saw_versions``) in the step they take. Unmarked, none reports it."""

    def seen_by(step: Callable[[], Any]) -> list[str]:
        with versions_seen() as seen:
            step()
        return seen

    assert seen_by(lambda: store.invalidate(keys)) == []
    assert seen_by(lambda: store.put(keys, "a", LEASE_MS, ENVELOPE, 60_000, False)) == []
    store.mark_versioned([keys], 60_000)
    assert seen_by(lambda: store.invalidate(keys)) == [keys.value]
    assert seen_by(lambda: store.expire(keys)) == [keys.value]
    assert seen_by(lambda: store.seize(keys, "b", LEASE_MS)) == [keys.value]
    assert store.release(keys, "b")
    assert seen_by(lambda: store.put(keys, "c", LEASE_MS, ENVELOPE, 60_000, False)) == [keys.value]
    assert store.get(keys.value) == ENVELOPE  # the mark changes nothing else
    assert seen_by(lambda: store.mark_versioned([], 60_000)) == []


def test_a_tagged_put_joins_its_tag_unless_the_tag_was_invalidated_since(store: Any, keys: EntryKeys) -> None:
    tags, tag = _tag(store)
    since = _tag_clock(store, tags)
    assert store.put(keys, "a", LEASE_MS, ENVELOPE, 60_000, True, Tagged(tags, since)) == Written.YES
    assert store.get(keys.value) == ENVELOPE and store.entry_tags(keys) == [tag.name]
    assert store.invalidate_tag(tags.clock, tag, False) == [keys.value]
    assert store.get(keys.value) is None
    assert store.put(keys, "b", LEASE_MS, ENVELOPE, 60_000, True, Tagged(tags, since)) == Written.REFUSED
    assert store.get(keys.value) is None and store.holder(keys) is None  # nothing written, no lease left


def test_renewal_extends_only_the_holders_lease(store: Any, keys: EntryKeys) -> None:
    # A first term of 2 s, not shorter: a stall of a loaded machine between the lease and
    # its renewal must not let it run out (with 200 ms, a Redlock lease once did, in CI).
    store.acquire(keys, "a", 2000, True)
    assert store.renew(keys, "a", LEASE_MS) is True
    held = store.acquire(keys, "b", LEASE_MS, True)
    assert held.lease_left > 2.5  # reset to the renewed term (5 s), not the first 2 s
    assert store.renew(keys, "b", LEASE_MS) is False
    assert store.release(keys, "a") is True
    assert store.renew(keys, "a", LEASE_MS) is False


def test_a_lease_nobody_renews_runs_out_and_is_taken_over(store: Any, keys: EntryKeys) -> None:
    if getattr(getattr(store, "_store", store), "session_leases", False):  # (a view's: see contract_view)
        pytest.skip("a ZooKeeper lease ends with its holder's session, not by a term (docs/lock-services.md)")
    store.acquire(keys, "a", 100, True)
    deadline = time.monotonic() + 5
    while store.acquire(keys, "b", LEASE_MS, True).state is not LockState.LOCKED:
        assert time.monotonic() < deadline, "the lease never ran out"
        time.sleep(0.02)
    assert store.holder(keys) == "b"


def test_release_is_by_token(store: Any, keys: EntryKeys) -> None:
    store.acquire(keys, "a", LEASE_MS, True)
    assert store.release(keys, "b") is False
    assert store.holder(keys) == "a"
    assert store.release(keys, "a") is True
    assert store.holder(keys) is None


def test_a_corrupt_value_can_be_locked_over(store: Any, keys: EntryKeys) -> None:
    store.acquire(keys, "a", LEASE_MS, True)
    store.write_release(keys, "a", b"garbage", 60_000, False)
    assert store.acquire(keys, "b", LEASE_MS, False).state is LockState.LOCKED


def test_waiters_are_woken_with_the_value_or_to_recheck(store: Any, keys: EntryKeys) -> None:
    subscription = store.subscribe(keys)
    try:
        store.acquire(keys, "a", LEASE_MS, True)
        store.write_release(keys, "a", ENVELOPE, 60_000, True)
        assert subscription.wait(5) == ENVELOPE  # inline: the value travels in the message
        store.acquire(keys, "b", LEASE_MS, False)
        store.write_release(keys, "b", ENVELOPE, 60_000, False)
        assert subscription.wait(5) == b""  # too large to travel: re-read the key
        store.acquire(keys, "c", LEASE_MS, False)
        store.release(keys, "c")
        assert subscription.wait(5) == b""
        store.invalidate(keys)
        assert subscription.wait(5) == b""
        assert subscription.wait(0.05) is None  # silence
    finally:
        subscription.close()


def test_named_locks_draw_growing_fences_and_queue_fairly(store: Any) -> None:
    keys = lock_keys("contract", f"lock-{uuid.uuid4().hex}", 200)
    first = store.take_lock(keys, "a", LEASE_MS)
    assert first.state is LockState.LOCKED and first.fence > 0
    assert store.take_lock(keys, "b", LEASE_MS, LEASE_MS).state is LockState.HELD  # b queues first
    assert store.take_lock(keys, "c", LEASE_MS, LEASE_MS).state is LockState.HELD
    store.release(keys, "a")
    assert store.take_lock(keys, "c", LEASE_MS, LEASE_MS).state is LockState.HELD  # not first in line
    second = store.take_lock(keys, "b", LEASE_MS, LEASE_MS)
    assert second.state is LockState.LOCKED and second.fence > first.fence
    store.leave_queue(keys, "c")
    store.release(keys, "b")
    assert store.take_lock(keys, "d", LEASE_MS, LEASE_MS).state is LockState.LOCKED  # c gave its place up


def test_a_budgets_slots_go_to_its_size_of_holders_then_to_waiters_in_arrival_order(store: Any) -> None:
    _needs(store, Roles.BUDGETS)
    keys = budget_keys("contract", f"budget-{uuid.uuid4().hex}", 200)
    assert [store.take_slot(keys, token, LEASE_MS, LEASE_MS, 2).state for token in "ab"] == [LockState.LOCKED] * 2
    held = store.take_slot(keys, "c", LEASE_MS, LEASE_MS, 2)  # c queues first
    assert held.state is LockState.HELD and 0 < held.lease_left <= LEASE_MS / 1000
    assert store.take_slot(keys, "d", LEASE_MS, LEASE_MS, 2).state is LockState.HELD
    assert store.take_slot(keys, "b", LEASE_MS, LEASE_MS, 2).state is LockState.LOCKED  # a holder's take renews
    assert store.renew_slot(keys, "b", LEASE_MS) is True
    assert store.renew_slot(keys, "c", LEASE_MS) is False  # a waiter has no slot to renew
    assert store.release_slot(keys, "a", 2, LEASE_MS) is True and store.release_slot(keys, "a", 2, LEASE_MS) is False
    assert store.renew_slot(keys, "c", LEASE_MS) is True  # a's slot was handed to c, first in line
    assert store.take_slot(keys, "d", LEASE_MS, LEASE_MS, 2).state is LockState.HELD
    assert store.take_slot(keys, "c", LEASE_MS, LEASE_MS, 2).state is LockState.LOCKED
    assert store.release_slot(keys, "d", 2, LEASE_MS) is False  # d gives its place up
    store.release_slot(keys, "b", 2, LEASE_MS)
    assert store.take_slot(keys, "e", LEASE_MS, LEASE_MS, 2).state is LockState.LOCKED
    assert store.take_slot(keys, "f", LEASE_MS, LEASE_MS, 2).state is LockState.HELD  # c and e hold both
    assert store.take_slot(keys, "f", LEASE_MS, LEASE_MS, 3).state is LockState.LOCKED  # a larger budget: room


def test_a_hot_set_counts_its_members_keeps_the_most_counted_and_runs_out(store: Any) -> None:
    _needs(store, Roles.HOT_SETS)
    key = f"contract:{{~hot:{uuid.uuid4().hex}}}:1"
    assert store.hot_members(key, 10) == []
    store.note_hot(key, {b"a": 1, b"b": 3, b"c": 2}, 10, LEASE_MS)
    store.note_hot(key, {b"a": 4, b"d": 1}, 10, LEASE_MS)
    assert store.hot_members(key, 10) == [(b"a", 5.0), (b"b", 3.0), (b"c", 2.0), (b"d", 1.0)]
    assert store.hot_members(key, 2) == [(b"a", 5.0), (b"b", 3.0)]
    store.note_hot(key, {b"e": 1}, 3, LEASE_MS)  # three kept: the least counted go, ties by member
    assert store.hot_members(key, 10) == [(b"a", 5.0), (b"b", 3.0), (b"c", 2.0)]
    store.note_hot(key, {}, 3, LEASE_MS)  # nothing to add: nothing changes
    assert len(store.hot_members(key, 10)) == 3
    brief = f"contract:{{~hot:{uuid.uuid4().hex}}}:1"
    store.note_hot(brief, {b"x\x00\xff": 1}, 10, 100)  # any bytes; gone with its ttl
    assert store.hot_members(brief, 10) == [(b"x\x00\xff", 1.0)]
    deadline = time.monotonic() + 5
    while store.hot_members(brief, 10):
        assert time.monotonic() < deadline, "the hot set never ran out"
        time.sleep(0.02)
    assert store.scan("contract", "~hot:*") == set()  # not a cache entry


def test_a_slot_nobody_renews_runs_out_and_a_waiter_who_stops_trying_loses_its_place(store: Any) -> None:
    _needs(store, Roles.BUDGETS)
    # 1 s leases: b's take must come while a's slot lives (with 100 ms, a stalled CI
    # machine let a's slot run out first, and b took it).
    keys = budget_keys("contract", f"budget-{uuid.uuid4().hex}", 200)
    assert store.take_slot(keys, "a", 1000, LEASE_MS, 1).state is LockState.LOCKED
    assert store.take_slot(keys, "b", LEASE_MS, 1000, 1).state is LockState.HELD  # b queues, then stops trying
    deadline = time.monotonic() + 5
    while store.take_slot(keys, "c", LEASE_MS, LEASE_MS, 1).state is not LockState.LOCKED:
        assert time.monotonic() < deadline, "the dead holder's slot, or the dead waiter's place, never ran out"
        time.sleep(0.02)
    assert store.renew_slot(keys, "a", LEASE_MS) is False  # its slot is c's now
    assert store.take_slot(keys, "b", LEASE_MS, LEASE_MS, 1).state is LockState.HELD


def test_a_released_slot_is_handed_to_the_first_waiter_in_line_and_only_it_is_woken(store: Any) -> None:
    _needs(store, Roles.BUDGETS)
    keys = budget_keys("contract", f"budget-{uuid.uuid4().hex}", 200)
    assert store.take_slot(keys, "a", LEASE_MS, LEASE_MS, 1).state is LockState.LOCKED
    assert [store.take_slot(keys, token, LEASE_MS, LEASE_MS, 1).state for token in "bcd"] == [LockState.HELD] * 3
    first, second = store.subscribe(keys.waiter("b")), store.subscribe(keys.waiter("c"))
    try:
        assert store.release_slot(keys, "a", 1, LEASE_MS) is True
        assert first.wait(5) == GRANTED  # b holds the slot now
        assert second.wait(0.05) is None  # one slot freed, one waiter woken
        assert store.renew_slot(keys, "b", LEASE_MS) is True
        assert store.release_slot(keys, "c", 1, LEASE_MS) is False  # c leaves the queue: it held no slot
        assert store.release_slot(keys, "b", 1, LEASE_MS) is True  # b gives the slot back: d's now
        assert second.wait(0.05) is None
        assert store.renew_slot(keys, "d", LEASE_MS) is True and store.renew_slot(keys, "c", LEASE_MS) is False
        assert store.take_slot(keys, "d", LEASE_MS, LEASE_MS, 1).state is LockState.LOCKED
    finally:
        first.close()
        second.close()


def test_a_slot_for_an_entry_goes_to_its_waiter_only_while_the_entrys_lease_is_its_own(store: Any) -> None:
    """``SlotLeaseStore``: a load asks for a slot with its entry's lease, and the store
    grants it only while the lease is its own. A waiter whose lease an invalidation took
    is told ``LEASE_GONE`` in its turn and the slot goes to the next in line; asked
    again, it is refused at once and does not queue."""
    _needs(store, Roles.SLOT_LEASES)
    budget = budget_keys("contract", f"budget-{uuid.uuid4().hex}", 200)
    a, b, c = (EntryKeys.for_value(f"contract:{{item:{uuid.uuid4().hex}}}") for _ in range(3))
    for entry, token in ((a, "lease-a"), (b, "lease-b"), (c, "lease-c")):
        assert store.acquire(entry, token, LEASE_MS, True).state is LockState.LOCKED
    assert store.take_slot_for(budget, "a", LEASE_MS, LEASE_MS, 1, a, "other").state is LockState.LEASE_GONE
    assert store.take_slot_for(budget, "a", LEASE_MS, LEASE_MS, 1, a, "lease-a").state is LockState.LOCKED
    assert store.take_slot_for(budget, "b", LEASE_MS, LEASE_MS, 1, b, "lease-b").state is LockState.HELD
    assert store.take_slot_for(budget, "c", LEASE_MS, LEASE_MS, 1, c, "lease-c").state is LockState.HELD
    first, second = store.subscribe(budget.waiter("b")), store.subscribe(budget.waiter("c"))
    try:
        store.invalidate(b)  # b's lease is gone while it queues
        assert store.release_slot(budget, "a", 1, LEASE_MS) is True
        assert first.wait(5) == LEASE_GONE  # its turn came: told, and out of the queue
        assert second.wait(5) == GRANTED  # the slot went on to c
        assert store.renew_slot(budget, "c", LEASE_MS) is True and store.renew_slot(budget, "b", LEASE_MS) is False
        assert store.take_slot_for(budget, "b", LEASE_MS, LEASE_MS, 1, b, "lease-b").state is LockState.LEASE_GONE
        store.invalidate(c)  # a holder whose lease is gone is told so when it asks again, and gives the slot back
        assert store.take_slot_for(budget, "c", LEASE_MS, LEASE_MS, 1, c, "lease-c").state is LockState.LEASE_GONE
        assert store.release_slot(budget, "c", 1, LEASE_MS) is True
        assert store.take_slot(budget, "d", LEASE_MS, LEASE_MS, 1).state is LockState.LOCKED  # b did not queue
    finally:
        first.close()
        second.close()


def test_scan_lists_the_entries_of_a_namespace_and_check_passes(store: Any, keys: EntryKeys) -> None:
    store.check("contract")
    store.acquire(keys, "a", LEASE_MS, True)
    store.write_release(keys, "a", ENVELOPE, 60_000, True)
    assert keys.value in store.scan("contract")


# --- freshness: reading with the TTL, locking over a stale value, holds, expire ----------

STALE_ENVELOPE = Codec().encode({"v": 1}, 1.0, 0.0, key="k", stale_for=30.0)


def test_a_value_is_read_with_the_seconds_the_store_keeps_it(store: Any, keys: EntryKeys) -> None:
    assert store.get_with_ttl(keys.value) == (None, 0.0, False)
    store.acquire(keys, "a", LEASE_MS, True)
    store.write_release(keys, "a", STALE_ENVELOPE, 60_000, False)
    raw, left, failing = store.get_with_ttl(keys.value)
    assert raw == STALE_ENVELOPE and 55 < left <= 60 and not failing


def test_the_lease_is_taken_over_a_stale_value_only_while_it_is_still_that_one(store: Any, keys: EntryKeys) -> None:
    store.acquire(keys, "a", LEASE_MS, True)
    store.write_release(keys, "a", STALE_ENVELOPE, 60_000, False)
    identity = STALE_ENVELOPE[:16]
    assert store.acquire(keys, "b", LEASE_MS, True, identity).state is LockState.LOCKED
    newer = Codec().encode({"v": 2}, 2.0, 0.0, key="k", stale_for=30.0)
    store.write_release(keys, "b", newer, 60_000, False)
    # Another process refreshed it meanwhile: the newer value comes back, no lease.
    assert store.acquire(keys, "c", LEASE_MS, True, identity) == AcquireReply(LockState.VALUE, newer)
    assert store.holder(keys) is None


def test_a_failed_loads_hold_keeps_everyone_out_and_says_so(store: Any, keys: EntryKeys) -> None:
    store.acquire(keys, "a", LEASE_MS, True)
    subscription = store.subscribe(keys)
    try:
        # A hold of a second: the wake-up, closing the subscription and the next acquire
        # fit in it even on a loaded machine (300 ms once did not, on ZooKeeper).
        assert store.hold(keys, "b", 1000, 60_000) is False  # not b's lease
        assert store.hold(keys, "a", 1000, 60_000) is True
        assert subscription.wait(5) == b""  # the waiters are woken
    finally:
        subscription.close()
    held = store.acquire(keys, "c", LEASE_MS, True)
    assert held.state is LockState.HELD and held.failed and held.lease_left <= 1.0
    assert store.write_release(keys, "a", ENVELOPE, 60_000, False) != Written.YES  # nobody's lease now
    deadline = time.monotonic() + 5
    while store.acquire(keys, "c", LEASE_MS, True).state is not LockState.LOCKED:
        assert time.monotonic() < deadline, "the hold never ended"
        time.sleep(0.02)
    assert store.acquire(keys, "d", LEASE_MS, True).failed is False  # a load's lease is no hold


def test_expire_keeps_the_value_for_its_stale_window_and_drops_the_lease(store: Any, keys: EntryKeys) -> None:
    store.acquire(keys, "a", LEASE_MS, True)
    store.write_release(keys, "a", STALE_ENVELOPE, 600_000, False)
    store.acquire(keys, "b", LEASE_MS, False)  # a load in flight
    store.expire(keys)
    raw, left, _ = store.get_with_ttl(keys.value)
    assert raw == STALE_ENVELOPE and 25 < left <= 30
    assert store.holder(keys) is None
    assert store.write_release(keys, "b", ENVELOPE, 60_000, False) != Written.YES
    store.expire(keys)  # again: never longer
    assert 0 < store.get_with_ttl(keys.value)[1] <= left
    plain = EntryKeys.for_value(keys.value + "plain")
    store.acquire(plain, "a", LEASE_MS, True)
    store.write_release(plain, "a", ENVELOPE, 60_000, False)
    store.expire(plain)  # no stale window: gone, as after invalidate
    assert store.get(plain.value) is None


def test_a_touch_keeps_the_value_it_names_fresh_again_and_releases_the_lease(store: Any, keys: EntryKeys) -> None:
    identity = STALE_ENVELOPE[:16]
    store.acquire(keys, "a", LEASE_MS, True)
    store.write_release(keys, "a", STALE_ENVELOPE, 20_000, False)  # past its ttl: 20 s left of a 30 s window
    assert store.acquire(keys, "b", LEASE_MS, True, identity).state is LockState.LOCKED
    assert store.touch(keys, "b", identity, 60_000) == Written.YES
    raw, left, _ = store.get_with_ttl(keys.value)
    assert raw == STALE_ENVELOPE and 55 < left <= 60  # the same bytes, living anew
    assert store.holder(keys) is None
    assert store.touch(keys, "b", identity, 60_000) != Written.YES  # the lease is gone: nothing done
    store.acquire(keys, "c", LEASE_MS, False)
    assert store.touch(keys, "c", ENVELOPE[:16], 60_000) == Written.REFUSED  # the value is another
    assert store.holder(keys) is None  # released all the same
    assert store.get_with_ttl(keys.value)[1] <= 60


def test_a_hold_marks_the_entry_failing_until_a_write_an_invalidation_or_an_expire(store: Any, keys: EntryKeys) -> None:
    def failing() -> bool:
        return bool(store.get_with_ttl(keys.value, True)[2])

    def fail_once(token: str) -> None:
        deadline = time.monotonic() + 5
        while store.acquire(keys, token, LEASE_MS, False).state is not LockState.LOCKED:
            assert time.monotonic() < deadline, "the hold never ended"
            time.sleep(0.01)
        assert store.hold(keys, token, 10, 60_000)

    store.acquire(keys, "a", LEASE_MS, True)
    store.write_release(keys, "a", STALE_ENVELOPE, 20_000, False)
    fail_once("b")
    assert failing()  # longer than the hold: until a load succeeds
    assert store.get_with_ttl(keys.value)[2] is False  # not asked: not read
    fail_once("c")
    assert store.write_release(keys, "c", ENVELOPE, 60_000, False) != Written.YES  # held: nothing written
    fail_once("d")  # then a successful write clears it
    deadline = time.monotonic() + 5
    while store.acquire(keys, "e", LEASE_MS, False).state is not LockState.LOCKED:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert store.write_release(keys, "e", STALE_ENVELOPE, 20_000, False) == Written.YES
    assert not failing()
    for drop in (store.invalidate, store.expire):
        store.acquire(keys, "f", LEASE_MS, True)
        store.write_release(keys, "f", STALE_ENVELOPE, 20_000, False)
        fail_once("g")
        drop(keys)
        store.acquire(keys, "h", LEASE_MS, True)
        store.write_release(keys, "h", STALE_ENVELOPE, 20_000, False)
        assert not failing()


def test_many_key_commands_answer_each_entry_as_its_single_key_command_does(store: Any, keys: EntryKeys) -> None:
    other, third = (EntryKeys.for_value(f"contract:{{item:{uuid.uuid4().hex}}}") for _ in range(2))
    assert store.get_many([keys.value, other.value]) == [None, None]
    taken = store.acquire_many([(keys, "a", LEASE_MS, True, b""), (other, "a", LEASE_MS, True, b"")])
    assert [reply.state for reply in taken] == [LockState.LOCKED, LockState.LOCKED]
    second = store.acquire_many([(keys, "b", LEASE_MS, True, b""), (third, "b", LEASE_MS, True, b"")])
    assert [reply.state for reply in second] == [LockState.HELD, LockState.LOCKED]
    assert 0 < second[0].lease_left <= LEASE_MS / 1000

    written = store.write_release_many(
        [(keys, "a", ENVELOPE, 60_000, True, None), (other, "b", ENVELOPE, 60_000, False, None)]
    )
    assert written[0] == Written.YES and written[1] != Written.YES  # "b" never held the other's lease
    assert store.get_many([keys.value, other.value, third.value]) == [ENVELOPE, None, None]
    (raw, ttl_left, failing), absent = store.get_many_with_ttl([keys.value, other.value], True)
    assert raw == ENVELOPE and 50 < ttl_left <= 60 and failing is False
    assert absent == (None, 0.0, False)
    assert store.acquire_many([(keys, "c", LEASE_MS, True, b"")]) == [AcquireReply(LockState.VALUE, ENVELOPE)]

    subscriptions = store.subscribe_many([other, third])  # confirmed: no wake-up after this is missed
    try:
        assert store.write_release_many([(third, "b", ENVELOPE, 60_000, True, None)]) == [Written.YES]
        assert subscriptions[1].wait(10) == ENVELOPE
        store.invalidate(other)
        assert subscriptions[0].wait(10) == b""
    finally:
        for subscription in subscriptions:
            subscription.close()


def _tag(store: Any) -> tuple[TagSet, TagKeys]:
    """A tag of its own for one test, in the contract's namespace."""
    tag = TagKeys.of("contract", f"tag:{uuid.uuid4().hex}")
    return TagSet(clock_key("contract"), (tag,)), tag


def _tag_clock(store: Any, tags: TagSet) -> int:
    """The tag clock, or a skip: a store without tags refuses them (``ConfigError``)."""
    try:
        return int(store.tag_clock(tags.clock))
    except ConfigError as error:
        pytest.skip(f"this store has no tags: {error}")


def test_a_tagged_write_joins_its_tag_and_the_tags_invalidation_drops_it(store: Any, keys: EntryKeys) -> None:
    tags, tag = _tag(store)
    since = _tag_clock(store, tags)
    store.acquire(keys, "a", LEASE_MS, True)
    assert store.write_release(keys, "a", ENVELOPE, 60_000, True, Tagged(tags, since)) == Written.YES
    assert store.get(keys.value) == ENVELOPE and store.holder(keys) is None
    assert store.entry_tags(keys) == [tag.name]
    assert store.invalidate_tag(tags.clock, tag, False) == [keys.value]
    assert store.get(keys.value) is None and store.entry_tags(keys) is None
    assert store.invalidate_tag(tags.clock, tag, False) == []  # the member was forgotten with its value


def test_a_tagged_write_of_a_load_begun_before_its_tags_invalidation_is_refused(store: Any, keys: EntryKeys) -> None:
    tags, tag = _tag(store)
    since = _tag_clock(store, tags)
    store.acquire(keys, "a", LEASE_MS, True)
    assert store.invalidate_tag(tags.clock, tag, False) == []  # nothing written yet: no member
    subscription = store.subscribe(keys)
    try:
        assert store.write_release(keys, "a", ENVELOPE, 60_000, True, Tagged(tags, since)) == Written.REFUSED
        assert subscription.wait(10) == b""  # the waiters are woken to load afresh
    finally:
        subscription.close()
    assert store.get(keys.value) is None and store.holder(keys) is None  # nothing written, the lease released
    later = store.tag_clock(tags.clock)  # a load that begins after the invalidation
    assert later > since
    store.acquire(keys, "b", LEASE_MS, True)
    assert store.write_release(keys, "b", ENVELOPE, 60_000, True, Tagged(tags, later)) == Written.YES


def test_a_soft_tag_invalidation_keeps_stale_values_as_members(store: Any, keys: EntryKeys) -> None:
    tags, tag = _tag(store)
    _tag_clock(store, tags)
    envelope = Codec().encode({"v": 1}, 0.0, 0.0, key=keys.value, stale_for=30.0)
    store.acquire(keys, "a", LEASE_MS, True)
    assert store.write_release(keys, "a", envelope, 60_000, True, Tagged(tags, store.tag_clock(tags.clock))) == 1
    assert store.invalidate_tag(tags.clock, tag, True) == [keys.value]
    raw, ttl_left, _ = store.get_with_ttl(keys.value)
    assert raw == envelope and 0 < ttl_left <= 30  # stale: kept for its stale window alone
    assert store.invalidate_tag(tags.clock, tag, False) == [keys.value]  # still a member
    assert store.get(keys.value) is None


def test_a_lease_taken_with_the_tag_clock_reads_it_as_a_load_about_to_begin(store: Any, keys: EntryKeys) -> None:
    """``acquire(clock=...)``: once the lease is taken, the tag clock is read with it (or
    ``since`` is None, and the flow reads it after). Either way it is read before the load
    begins: a tag invalidated after it refuses the write, and a lease taken after the
    invalidation reads a clock the tag admits."""
    tags, tag = _tag(store)
    before = _tag_clock(store, tags)
    taken = store.acquire(keys, "a", LEASE_MS, True, clock=tags.clock)
    assert taken.state is LockState.LOCKED
    since = taken.since if taken.since is not None else store.tag_clock(tags.clock)
    assert since >= before
    held = store.acquire(keys, "b", LEASE_MS, True, clock=tags.clock)
    assert held.state is LockState.HELD and held.since is None  # read once the lease is taken only
    store.invalidate_tag(tags.clock, tag, False)
    assert store.write_release(keys, "a", ENVELOPE, 60_000, True, Tagged(tags, since)) == Written.REFUSED
    assert store.holder(keys) is None
    again = store.acquire(keys, "c", LEASE_MS, True, clock=tags.clock)
    assert again.state is LockState.LOCKED
    later = again.since if again.since is not None else store.tag_clock(tags.clock)
    assert later > since
    assert store.write_release(keys, "c", ENVELOPE, 60_000, True, Tagged(tags, later)) == Written.YES
    found = store.acquire(keys, "d", LEASE_MS, True, clock=tags.clock)
    assert found.state is LockState.VALUE and found.raw == ENVELOPE and found.since is None


def test_a_runs_relay_hands_out_its_records_in_order_from_any_place(store: Any, keys: EntryKeys) -> None:
    _needs(store, Roles.STREAMS)
    token, other = uuid.uuid4().hex, uuid.uuid4().hex
    assert store.relay_read(keys, token, 0, 0) == []  # nothing relayed yet, and no wait asked
    store.relay_add(keys, token, [b"c\x00a", b"cb"], 0, LEASE_MS)
    store.relay_add(keys, token, [b"cc", b"e"], 2, LEASE_MS)
    assert store.relay_read(keys, token, 0, 0) == [b"c\x00a", b"cb", b"cc", b"e"]  # any bytes, in order
    assert store.relay_read(keys, token, 3, 0) == [b"e"]
    assert store.relay_read(keys, token, 4, 0) == []
    with contextlib.suppress(BackendUnavailable):  # a place taken already: refused, or ignored
        store.relay_add(keys, token, [b"cx"], 1, LEASE_MS)
    assert store.relay_read(keys, token, 0, 0) == [b"c\x00a", b"cb", b"cc", b"e"]
    assert store.relay_read(keys, other, 0, 0) == []  # each run's relay is its own


def test_a_relay_read_waits_for_the_next_record(store: Any, keys: EntryKeys) -> None:
    _needs(store, Roles.STREAMS)
    token = uuid.uuid4().hex
    store.relay_add(keys, token, [b"c1"], 0, LEASE_MS)
    read: list[list[bytes]] = []
    reader = threading.Thread(target=lambda: read.append(store.relay_read(keys, token, 1, 15_000)))
    reader.start()
    store.relay_add(keys, token, [b"c2"], 1, LEASE_MS)
    reader.join(timeout=30)
    assert read == [[b"c2"]]  # had it slept its 15 s through, the test would have timed out first


def test_a_relay_runs_out_after_its_linger_and_never_reads_from_its_middle(store: Any, keys: EntryKeys) -> None:
    _needs(store, Roles.STREAMS)
    token = uuid.uuid4().hex
    store.relay_add(keys, token, [b"c1", b"c2"], 0, 100)
    deadline = time.monotonic() + 10
    while store.relay_read(keys, token, 0, 0):
        assert time.monotonic() < deadline, "the relay never ran out"
        time.sleep(0.02)
    store.relay_add(keys, token, [b"c3"], 2, LEASE_MS)  # a run that goes on after its relay ran out
    assert store.relay_read(keys, token, 0, 0) == []  # its first records are gone: none, not c3 as the first
    assert store.relay_read(keys, token, 2, 0) == [b"c3"]


def _needs(store: Any, role: Roles) -> None:
    """Skip a test of an optional role the store does not declare (``optional_roles``)."""
    if role not in roles_of(store):
        pytest.skip(f"this store does not declare {role}: a loader that needs it is refused at decoration")
