# Generated from abatched.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""The performer of a batch of flows (``_core.batch``): a step of one entry goes to that
entry's own performer, the steps of many entries go together (one round trip for every
lease or every write, one call of the loader for every load)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

from .._core.batch import Each, One
from .._core.effects import Acquire, ReadTagClock, Subscribe, WriteRelease
from .._core.flight import loading_all
from .._core.store import Renewable, Store
from .batch_entries import Entry, acquire_calls, clock_keys, leased, replies, subscribed, write_calls
from .observe import Events
from .perform import Performer, lease_held
from .watchdog import Watchdog

log = logging.getLogger("stampede.cache")


class BatchPerformer:
    """Performs a batch's steps. ``load`` calls the loader with the ids at the given
    positions and returns their values in that order."""

    def __init__(
        self,
        entries: Sequence[Entry],
        store: Store,
        load: Callable[[list[int]], list[Any]],
        watchdog: Watchdog,
        renewal: Renewable,
        events: Events,
    ) -> None:
        self._entries = entries
        self._store = store
        self._load = load
        self._watchdog = watchdog
        self._renewal = renewal
        self._events = events

    def __call__(self, step: One | Each) -> Any:
        if isinstance(step, One):
            entry = self._entries[step.index]
            entry.count(step.effect)
            performer: Performer = entry.performer
            return performer(step.effect)
        entries = [self._entries[one.index] for one in step.steps]
        for entry, one in zip(entries, step.steps, strict=True):
            entry.count(one.effect)
        first = step.steps[0].effect
        if isinstance(first, Acquire):
            return replies(self._store.acquire_many(acquire_calls(entries, step.steps)))
        if isinstance(first, WriteRelease):
            writes = write_calls(entries, step.steps)
            return replies(self._store.write_release_many(writes))
        if isinstance(first, Subscribe):
            subscriptions = self._store.subscribe_many([entry.lease.keys for entry in entries])
            return subscribed(entries, subscriptions)
        if isinstance(first, ReadTagClock):
            clocks = {key: self._store.tag_clock(key) for key in clock_keys(step.steps)}
            return [clocks[one.effect.key] for one in step.steps]  # type: ignore[union-attr]
        log.debug("loading %d entries in one call: %s, ...", len(entries), entries[0].lease.keys.value)
        with ExitStack() as stack:
            stack.enter_context(loading_all(entry.lease.keys.value for entry in entries))
            stack.enter_context(lease_held(None))  # its budget asks no lease: the writes refuse what was lost
            stack.enter_context(self._watchdog.guard_many(self._renewal, leased(entries, step.steps)))
            self._events.incr("batch_loads")
            return self._load([entry.position for entry in entries])
