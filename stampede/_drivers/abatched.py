"""The performer of a batch of flows (``_core.batch``): a step of one entry goes to that
entry's own performer, the steps of many entries go together (one round trip for every
lease or every write, one call of the loader for every load)."""

# batched.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from typing import Any

from .._core.batch import Each, One
from .._core.effects import Acquire, ReadTagClock, Subscribe, WriteRelease
from .._core.flight import loading_all
from .._core.store import AsyncRenewable, AsyncStore
from .aperform import AsyncPerformer, lease_held
from .batch_entries import Entry, acquire_calls, clock_keys, leased, replies, subscribed, to_the_end, write_calls
from .observe import Events
from .watchdog import AsyncWatchdog

log = logging.getLogger("stampede.cache")


class AsyncBatchPerformer:
    """Performs a batch's steps. ``load`` calls the loader with the ids at the given
    positions and returns their values in that order."""

    def __init__(
        self,
        entries: Sequence[Entry],
        store: AsyncStore,
        load: Callable[[list[int]], Awaitable[list[Any]]],
        watchdog: AsyncWatchdog,
        renewal: AsyncRenewable,
        events: Events,
    ) -> None:
        self._entries = entries
        self._store = store
        self._load = load
        self._watchdog = watchdog
        self._renewal = renewal
        self._events = events

    async def __call__(self, step: One | Each) -> Any:
        if isinstance(step, One):
            entry = self._entries[step.index]
            entry.count(step.effect)
            performer: AsyncPerformer = entry.performer
            return await performer(step.effect)
        entries = [self._entries[one.index] for one in step.steps]
        for entry, one in zip(entries, step.steps, strict=True):
            entry.count(one.effect)
        first = step.steps[0].effect
        if isinstance(first, Acquire):
            return replies(await self._store.acquire_many(acquire_calls(entries, step.steps)))
        if isinstance(first, WriteRelease):
            writes = write_calls(entries, step.steps)
            if True:  # ASYNC
                return replies(await to_the_end(self._store.write_release_many(writes)))  # not cut by a cancel
            else:
                return replies(self._store.write_release_many(writes))
        if isinstance(first, Subscribe):
            subscriptions = await self._store.subscribe_many([entry.lease.keys for entry in entries])
            return subscribed(entries, subscriptions)
        if isinstance(first, ReadTagClock):
            clocks = {key: await self._store.tag_clock(key) for key in clock_keys(step.steps)}
            return [clocks[one.effect.key] for one in step.steps]  # type: ignore[union-attr]
        log.debug("loading %d entries in one call: %s, ...", len(entries), entries[0].lease.keys.value)
        with ExitStack() as stack:
            stack.enter_context(loading_all(entry.lease.keys.value for entry in entries))
            stack.enter_context(lease_held(None))  # its budget asks no lease: the writes refuse what was lost
            stack.enter_context(self._watchdog.guard_many(self._renewal, leased(entries, step.steps)))
            self._events.incr("batch_loads")
            return await self._load([entry.position for entry in entries])
