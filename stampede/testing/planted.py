"""Defects planted on purpose, each the way a real bug broke a promise, to prove that the
simulator (``stampede.testing.simulation``) finds what real bugs look like: a run with one
planted must fail within a few seeds (tests/simulation, loadtest/bench_simulation.py).

    with planted(*DEFECTS["a write that does not check its lease"]):
        result = Simulation(seed=1).run()   # not result.ok

Each defect is ``(target, attribute, replacement)``, or several such triples (a defect
of two steps): ``planted`` swaps the attributes for the ``with`` block and puts them back
after. ``OPTIONS`` holds what a defect needs of the
simulation to show (a budget's slot needs a budget, and loads long enough that a kill
finds one held; a lock's defects, tasks that take the named lock; the near caches'
defects, near caches): ``Simulation(seed=N, **OPTIONS.get(name, {}))``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._backend import MemoryStore
from .._core import near, world
from .._core.effects import Decision
from .._core.flight import Flight
from .._core.leases import OneServerSteps
from .._core.store import AcquireReply
from .._parts import LayerParts
from .simulation import Faults
from .workload import Mix

_WRITE = MemoryStore._write_release
_DECIDED = Flight.decided
_TAKE_SLOT = MemoryStore._take_slot
_FORGET = LayerParts.forget
_TAKE_LOCK = MemoryStore.take_lock
_STEP_SUBSCRIBE = OneServerSteps.subscribe
_STEP_ACQUIRE = OneServerSteps.acquire


def _careless_write(store: MemoryStore, keys: Any, token: str, *args: Any) -> Any:
    """The write takes the lease, whoever held it (an invalidation's deletion is undone)."""
    store._leases[keys.lock] = (token, store._clock() + 1.0)
    return _WRITE(store, keys, token, *args)


def _unproven_wake_up(flight: Flight, unwritten: bool, via_notice: bool, *args: Any) -> None:
    """A value that came in a wake-up goes to every joiner, even those who came after the
    subscription: nothing proves it was written after they began."""
    _DECIDED(flight, unwritten, False, *args)


def _late_release(store: MemoryStore, keys: Any, token: str) -> bool:
    """A release deletes the lease whoever holds it now (a path reused after an
    invalidation: the next holder's lease goes with the late holder's release)."""
    with store._lock:
        store._leases.pop(keys.lock, None)
        store._publish(keys, b"")
        return True


def _slot_kept_by_the_dead(
    store: MemoryStore, keys: Any, token: str, lease_ms: int, queue_ms: int, slots: int, now: float
) -> Any:
    """A budget's slot outlives its term: a holder that died holding it keeps it, and the
    budget never counts it free again (its living holders still give theirs back)."""
    holders = store._slots.setdefault(keys.lock, {})
    for holder in holders:
        holders[holder] = max(holders[holder], now + 3600.0)
    return _TAKE_SLOT(store, keys, token, lease_ms, queue_ms, slots, now)


def _only_the_dropped(members: list[str], dropped: list[str], tag_key: str) -> tuple[list[str], bool]:
    """A tag invalidation asks the near caches about the members it dropped itself: one
    another invalidation deleted first, which has not asked them yet, stays copied."""
    return list(dropped), False


def _near_copy_dropped_late(parts: LayerParts, key: str) -> None:
    """The layer drops its own near copy of an invalidated entry after the invalidation
    has returned (at the event loop's next turn), not before."""
    copies, parts.near = parts.near, None
    try:
        _FORGET(parts, key)
    finally:
        parts.near = copies
    if copies is not None:
        asyncio.get_running_loop().call_soon(copies.drop, [key])


def _fence_of_the_holder_s_clock(store: MemoryStore, keys: Any, token: str, lease_ms: int, queue_ms: int = 0) -> Any:
    """A named lock's fence drawn from the acquirer's own clock (a timestamp), not from
    the store's counter: processes' clocks disagree, so a later holder may get a lower one."""
    reply = _TAKE_LOCK(store, keys, token, lease_ms, queue_ms)
    return dataclasses.replace(reply, fence=int(world.wall() * 1_000_000)) if reply.fence else reply


_PUT_OFF: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()  # the waiters whose subscription waits


def _subscription_put_off(steps: OneServerSteps) -> Decision[None]:
    """A waiter's subscription, put off until after its re-check (``_resubscribed``)."""
    task = asyncio.current_task()
    if task is not None:
        _PUT_OFF.add(task)
    return
    yield  # a decision of no effect


def _resubscribed(steps: OneServerSteps, check_value: bool, stale: bytes = b"") -> Decision[AcquireReply]:
    """The lease's step, then the subscription put off before it: a wake-up published
    between the re-check and the subscription is missed, and the waiter waits a re-check
    out."""
    reply: AcquireReply = yield from _STEP_ACQUIRE(steps, check_value, stale)
    task = asyncio.current_task()
    if task is not None and task in _PUT_OFF:
        _PUT_OFF.discard(task)
        yield from _STEP_SUBSCRIBE(steps)
    return reply


DEFECTS: dict[str, tuple[Any, ...]] = {
    "a write that does not check its lease": (MemoryStore, "_write_release", _careless_write),
    "a wake-up taken as the value without proof": (Flight, "decided", _unproven_wake_up),
    "a late release deletes the next holder's lease": (MemoryStore, "release", _late_release),
    "a killed holder's budget slot never returned": (MemoryStore, "_take_slot", _slot_kept_by_the_dead),
    "invalidate_tag skips the near caches of entries already deleted": (near, "asked_of_a_tag", _only_the_dropped),
    "a near copy dropped after the invalidation returns": (LayerParts, "forget", _near_copy_dropped_late),
    "a named lock's fence drawn from the holder's clock": (MemoryStore, "take_lock", _fence_of_the_holder_s_clock),
    "a waiter that subscribes after its re-check": (
        (OneServerSteps, "subscribe", _subscription_put_off),
        (OneServerSteps, "acquire", _resubscribed),
    ),
}
OPTIONS: dict[str, dict[str, Any]] = {
    "a killed holder's budget slot never returned": {  # killed at its commands, with no restart to free the slot
        "settings": {"max_concurrent_loads": 1},
        "query": 0.05,
        "operations": 500,
        "horizon": 60.0,
        "faults": Faults(restart=0.0, crash=0.001),
    },
    "invalidate_tag skips the near caches of entries already deleted": {
        "settings": {"near_cache": True},
        "mix": Mix(update_tag=8),
    },
    "a near copy dropped after the invalidation returns": {"settings": {"near_cache": True}},
    "a named lock's fence drawn from the holder's clock": {"lockers": 1},
    "a waiter that subscribes after its re-check": {  # no fault: every wait ends with a wake-up, well within 0.1 s
        "faults": Faults.none(),
        "failures": 0.0,
        "wait_bound": 0.1,
    },
    "a late release deletes the next holder's lease": {"lockers": 2},  # the lock's checker sees two holders
}


@contextmanager
def planted(*patch: Any) -> Iterator[None]:
    """``target.name`` replaced by ``replacement`` for the ``with`` block: one patch
    ``(target, name, replacement)``, or several such triples (a defect of two steps)."""
    patches = [patch] if len(patch) == 3 and not isinstance(patch[0], tuple) else list(patch)
    kept = [(target, name, getattr(target, name)) for target, name, _ in patches]
    for target, name, replacement in patches:
        setattr(target, name, replacement)
    try:
        yield
    finally:
        for target, name, original in reversed(kept):
            setattr(target, name, original)


__all__ = ["DEFECTS", "OPTIONS", "planted"]
