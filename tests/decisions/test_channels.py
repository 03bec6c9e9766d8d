"""The subscriber's bookkeeping and the asyncio flight table: pure rules, no server."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from stampede._backends.channels import Channels
from stampede._core.effects import Acquire, AwaitNotice, Lease, Load, Release, Subscribe, WriteRelease
from stampede._core.flight import Flight
from stampede._core.keys import EntryKeys
from stampede._drivers.singleflight import AsyncFlightTable
from stampede._drivers.watchdog import LOOP_WATCHDOG, Watchdog


class Box:
    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.messages: list[bytes] = []
        self.confirmed: list[bool] = []

    def deliver(self, message: bytes) -> None:
        self.messages.append(message)

    def confirm(self, ok: bool) -> None:
        self.confirmed.append(ok)


def test_every_mailbox_subscribes_and_is_confirmed_by_its_own_subscribe() -> None:
    channels = Channels()
    first, second = Box("a"), Box("a")
    assert channels.add(first) is True  # send SUBSCRIBE
    assert channels.add(second) is True  # again: its own confirmation fences it
    assert first.confirmed == second.confirmed == []
    channels.on_reply([b"subscribe", b"a", 1])
    assert first.confirmed == [True] and second.confirmed == []
    channels.on_reply([b"subscribe", b"a", 1])
    assert second.confirmed == [True]


def test_a_message_read_before_a_mailbox_is_confirmed_is_not_its_own() -> None:
    """The message was published before the server ran the mailbox's SUBSCRIBE: before
    its waiter began, perhaps before an invalidation that removed its value."""
    channels = Channels()
    early, late = Box("a"), Box("a")
    channels.add(early)
    channels.on_reply([b"subscribe", b"a", 1])
    channels.add(late)
    channels.on_reply([b"message", b"a", b"old"])
    channels.on_reply([b"subscribe", b"a", 1])
    channels.on_reply([b"message", b"a", b"new"])
    assert early.messages == [b"old", b"new"]
    assert late.messages == [b"new"]


def test_a_confirmation_meant_for_a_mailbox_that_left_confirms_no_later_one() -> None:
    channels = Channels()
    gone, late = Box("a"), Box("a")
    channels.add(gone)
    assert channels.remove(gone) is True  # send UNSUBSCRIBE
    channels.add(late)
    channels.on_reply([b"subscribe", b"a", 1])  # the reply to gone's SUBSCRIBE
    channels.on_reply([b"message", b"a", b"old"])
    assert late.confirmed == [] and late.messages == []
    channels.on_reply([b"unsubscribe", b"a", 0])
    channels.on_reply([b"subscribe", b"a", 1])
    assert late.confirmed == [True]


def test_messages_reach_their_channel_only_and_the_last_to_leave_unsubscribes() -> None:
    channels = Channels()
    a1, a2, b = Box("a"), Box("a"), Box("b")
    for box in (a1, a2, b):
        channels.add(box)
    for channel in (b"a", b"a", b"b"):
        channels.on_reply([b"subscribe", channel, 1])
    channels.on_reply([b"message", b"a", b"value"])
    assert a1.messages == a2.messages == [b"value"] and b.messages == []
    assert channels.remove(a1) is False
    assert channels.remove(a2) is True  # send UNSUBSCRIBE
    assert channels.remove(a2) is False  # twice is harmless
    assert channels.resubscribe() == ["b"]


def test_a_lost_connection_fails_the_unconfirmed_and_wakes_everyone() -> None:
    channels = Channels()
    confirmed, pending = Box("a"), Box("b")
    channels.add(confirmed)
    channels.on_reply([b"subscribe", b"a", 1])
    channels.add(pending)
    channels.on_connection_lost()
    assert pending.confirmed == [False]
    assert confirmed.messages == [b""] and pending.messages == [b""]  # re-check, spuriously or not


def test_mailboxes_joining_during_a_resubscribe_wait_for_its_confirmation() -> None:
    channels = Channels()
    channels.add(Box("a"))
    channels.on_reply([b"subscribe", b"a", 1])
    channels.on_connection_lost()
    assert channels.resubscribe() == ["a"]
    joiner = Box("a")
    channels.add(joiner)
    channels.on_reply([b"subscribe", b"a", 1])  # the new connection's SUBSCRIBE
    assert joiner.confirmed == []  # not before its own SUBSCRIBE is confirmed
    channels.on_reply([b"subscribe", b"a", 1])
    assert joiner.confirmed == [True]


def test_joiners_of_an_async_flight_time_out_on_their_own_deadlines() -> None:
    async def main() -> list[object]:
        table = AsyncFlightTable()
        flight, leads = table.join("k")
        assert leads
        short = table.wait(table.join("k")[0], 0.01)
        long = table.wait(flight, 5)
        shorter_late = table.wait(flight, 0.001)  # joined later, due sooner: the timer moves up
        outcomes: list[object] = [await shorter_late, await short]
        assert not long.done()
        table.finish("k", flight, value=42)
        outcomes.append(await long)
        assert flight.timer is None
        return outcomes

    assert asyncio.run(main()) == [False, False, True]


def test_a_cancelled_joiner_does_not_cancel_the_others() -> None:
    async def main() -> bool:
        table = AsyncFlightTable()
        flight, _ = table.join("k")
        first, second = table.wait(flight, 5), table.wait(flight, 5)
        first.cancel()
        table.finish("k", flight, value=1)
        return await second

    assert asyncio.run(main()) is True


def finished(sent: int, value: object = "v", error: BaseException | None = None, unwritten: bool = False) -> Flight:
    flight = Flight()
    flight.sent, flight.value, flight.error, flight.unwritten = sent, value, error, unwritten
    return flight


def test_a_value_is_shared_only_with_those_who_joined_before_its_command_was_sent() -> None:
    # a hit: the leader's GET was command 1; a joiner who saw sent == 1 arrived after it
    assert finished(sent=1).starts_over(joined_at=1)
    # a load: joined during the load (GET and acquire sent), before the write (command 3)
    assert not finished(sent=3).starts_over(joined_at=2)
    # a caller that started over once is early for every flight it meets
    assert not finished(sent=1).starts_over(joined_at=None)


def test_refused_writes_and_interruptions_send_everyone_back_but_errors_are_shared() -> None:
    assert finished(sent=3, unwritten=True).starts_over(joined_at=None)
    assert finished(sent=2, error=KeyboardInterrupt()).starts_over(joined_at=0)
    assert not finished(sent=1, error=LookupError("down")).starts_over(joined_at=1)


def test_the_leader_counts_the_steps_that_may_produce_its_value() -> None:
    flight = Flight()
    for effect in (Acquire(), Load(leased=True), WriteRelease(b"v", 1000, True)):
        flight.count(effect)
    assert flight.sent == 2  # a leased load's value is decided by its write
    flight.count(Load(leased=False))  # without the lease, the load itself decides
    flight.count(Release())
    assert flight.sent == 4


def test_a_value_from_a_message_goes_only_to_who_arrived_before_the_subscription() -> None:
    flight = Flight()
    for effect in (Acquire(), Subscribe(), Acquire(), AwaitNotice(1.0), Acquire(), AwaitNotice(1.0)):
        flight.count(effect)
    flight.value = "v"
    flight.decided(unwritten=False, via_notice=True)
    assert not flight.starts_over(joined_at=1)  # joined before the subscription
    assert flight.starts_over(joined_at=3)  # joined during the first wait, before the re-check


class CountingCondition:
    """A threading.Condition that counts how often the watchdog's thread is woken."""

    def __init__(self, inner: threading.Condition) -> None:
        self.inner, self.notified = inner, 0

    def notify(self) -> None:
        self.notified += 1
        self.inner.notify()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_short_leases_one_after_another_do_not_wake_the_watchdog_each_time() -> None:
    """A lock taken and released over and over registers a lease each time; the thread is
    woken for the first only, since each later one is due after a lease already waited on."""
    watchdog = Watchdog()
    counting = CountingCondition(watchdog._changed)
    watchdog._changed = counting  # type: ignore[assignment]
    keys = EntryKeys("v", "l", "c")
    try:
        for _ in range(200):
            lease = watchdog.watch(None, keys, "token", 30_000)  # type: ignore[arg-type]
            lease.active = False
            time.sleep(0.0002)  # the thread gets its turn
        assert counting.notified <= 2, counting.notified
    finally:
        watchdog.close()


def test_a_batchs_leases_are_watched_in_one_step_and_all_dropped_after_it() -> None:
    """A page of 50 cold entries registers its leases under one hold of the lock and wakes
    the thread once; when the load ends, every one of them is over."""
    watchdog = Watchdog()
    counting = CountingCondition(watchdog._changed)
    watchdog._changed = counting  # type: ignore[assignment]
    leases = [Lease(EntryKeys(f"v{n}", f"l{n}", f"c{n}"), f"token{n}", 30_000) for n in range(50)]
    try:
        with watchdog.guard_many(None, leases) as watched:  # type: ignore[arg-type]
            assert [lease.token for lease in watched] == [lease.token for lease in leases]
            assert all(lease.active for lease in watched) and len(watchdog._heap) == 50
        assert not any(lease.active for lease in watched)
        assert counting.notified == 1
    finally:
        watchdog.close()


class Renewals:
    """An asyncio store whose renewals keep ``kept``'s leases and find the others lost;
    ``stuck``'s renewal never answers (a server that stopped answering)."""

    def __init__(self, kept: set[str], enough: int, stuck: str = "") -> None:
        self.kept, self.enough, self.stuck = kept, enough, stuck
        self.calls: dict[str, int] = {}
        self.renewed_enough = asyncio.Event()

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        self.calls[token] = self.calls.get(token, 0) + 1
        if token == self.stuck:
            await asyncio.Event().wait()
        if min(self.calls.get(kept, 0) for kept in self.kept) >= self.enough:
            self.renewed_enough.set()
        return token in self.kept


def test_one_task_renews_an_asyncio_batchs_leases_each_until_lost_or_the_load_ends() -> None:
    async def main() -> tuple[dict[str, int], asyncio.Task[Any]]:
        store = Renewals(kept={"a", "b"}, enough=3, stuck="stuck")
        leases = [Lease(EntryKeys(n, n + ":lock", n + ":c"), n, 30) for n in ("a", "stuck", "b", "lost")]
        tasks_before = asyncio.all_tasks()
        with LOOP_WATCHDOG.guard_many(store, leases):  # type: ignore[arg-type]
            (renewing,) = asyncio.all_tasks() - tasks_before  # one task for the three
            await asyncio.wait_for(store.renewed_enough.wait(), 10)
        await asyncio.sleep(0)  # the cancellation is delivered
        return dict(store.calls), renewing

    calls, renewing = asyncio.run(main())
    assert calls["a"] >= 3 and calls["b"] >= 3
    assert calls["lost"] == 1  # found lost at its first renewal: never asked again
    assert calls["stuck"] == 1  # still waiting for its server: the others went on without it
    assert renewing.cancelled()
