"""A layer's load budgets (``_core.budget``) by name: one ``LoadBudget`` per name, whatever
loader asks for it, with this process's own count of its slots, the bound kept while the
store cannot be reached (``_drivers.abudget``)."""

from __future__ import annotations

import asyncio
import threading
import weakref

from .._core.budget import LoadBudget, new_budget, refuse_another_size
from .._core.config import Settings


class LocalCount:
    """A budget's bound kept by this process alone, while the store cannot be reached:
    a semaphore for its threads, and one per event loop for its tasks."""

    def __init__(self, slots: int) -> None:
        self.threads = threading.BoundedSemaphore(slots)
        self.loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._slots = slots

    def of_loop(self, loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
        """The running loop's semaphore (only that loop uses it: no lock needed)."""
        local = self.loops.get(loop)
        if local is None:
            local = self.loops[loop] = asyncio.Semaphore(self._slots)
        return local


class Budgets:
    def __init__(self, namespace: str, max_key_length: int) -> None:
        self._namespace = namespace
        self._max_key_length = max_key_length
        self._by_name: dict[str, tuple[LoadBudget, LocalCount]] = {}
        self._lock = threading.Lock()

    def get(self, name: str, settings: Settings) -> tuple[LoadBudget, LocalCount]:
        """The budget ``name`` and its per-process count; a ConfigError if it exists with
        another size than ``settings.max_concurrent_loads``."""
        with self._lock:
            found = self._by_name.get(name)
            if found is None:
                budget = new_budget(self._namespace, self._max_key_length, name, settings)
                found = self._by_name[name] = (budget, LocalCount(budget.slots))
        refuse_another_size(found[0], settings.max_concurrent_loads)
        return found
