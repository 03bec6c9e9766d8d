# Generated from _atap.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""A run's relay as one process reads it: the listeners of a run in this process (of one
event loop) share one ``Tap``, so that the store sends each record to the process once,
whoever of them reads, and the others wait in memory for what it read. Memory per run
is the run's own records, however many listen.

Invariants, under ``_lock``. ``records`` only grows, in the relay's order. At most one
listener reads the store at a time (``_reading``), from ``len(records)``. A listener
that waits for it is woken when it is done (its event set), records or none.
"""

from __future__ import annotations

import threading
from typing import Any

from ._core.effects import milliseconds
from ._core.keys import EntryKeys
from ._core.store import Store, StreamStore
from ._fork import reset_after_fork


class Tap:
    """One run's records as this process read them (see the module's docstring)."""

    def __init__(self, store: Store, relay: StreamStore, keys: EntryKeys, holder: str) -> None:
        self._store = store
        self._relay = relay
        self._keys = keys
        self._holder = holder  # the run's lease token: its relay's name
        self.records: list[bytes] = []
        self.lost = False  # the run's lease went, and its relay ended short of its end
        self.listeners = 0  # in this process, under the table's lock (``Taps``)
        self._lock = threading.Lock()  # held for no await: a task's steps, a thread's
        self._reading: Any = None  # the read under way: an event set when it is done

    def after(self, after: int, wait: float) -> list[bytes]:
        """The records from place ``after`` on: those read already, or else those the
        next read of the store brings (it waits up to ``wait`` seconds for one). An
        empty list: nothing came (``lost`` says whether the run is gone)."""
        with self._lock:
            if len(self.records) > after or self.lost:
                return self.records[after:]
            reading, leads = self._reading, self._reading is None
            if leads:
                reading = self._reading = threading.Event()
        if not leads:  # another listener reads: wait for what it brings
            reading.wait(wait + 1.0)
            with self._lock:
                return self.records[after:]
        got: list[bytes] = []
        try:
            got = self._read(len(self.records), wait)
        finally:
            with self._lock:
                self.records.extend(got)
                self._reading = None
            reading.set()
        with self._lock:
            return self.records[after:]

    def _read(self, place: int, wait: float) -> list[bytes]:
        """The store's next records. After a silence, whether the run still holds its
        lease (if not, one more read: its last records may have come meanwhile)."""
        keys, holder = self._keys, self._holder
        got = self._relay.relay_read(keys, holder, place, milliseconds(wait))
        if got or self._store.holder(keys) == holder:
            return got
        got = self._relay.relay_read(keys, holder, place, 0)
        self.lost = not got
        return got


class Taps:
    """The taps of one streamed loader's runs, in this process: one per run (and event
    loop), made by its first listener, dropped when its last one leaves."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taps: dict[Any, Tap] = {}
        reset_after_fork(self)

    def after_fork_in_child(self) -> None:
        """The parent's listeners are not in this process (and one may have held the lock)."""
        self._lock = threading.Lock()
        self._taps = {}

    def join(self, store: Store, relay: StreamStore, keys: EntryKeys, holder: str) -> Tap:
        name = _name(keys, holder)
        with self._lock:
            tap = self._taps.get(name)
            if tap is None:
                tap = self._taps[name] = Tap(store, relay, keys, holder)
            tap.listeners += 1
        return tap

    def leave(self, tap: Tap, keys: EntryKeys, holder: str) -> None:
        name = _name(keys, holder)
        with self._lock:
            tap.listeners -= 1
            if tap.listeners == 0 and self._taps.get(name) is tap:
                del self._taps[name]


def _name(keys: EntryKeys, holder: str) -> Any:
    """A tap's name in the table: its run's relay (and event loop: an Event is its loop's)."""
    return keys.relay(holder)
