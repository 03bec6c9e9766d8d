"""A layer's load budgets (``_core.budget``) by name: one ``LoadBudget`` per name, whatever
loader asks for it, with this process's own count of its slots, the bound kept while the
store cannot be reached (``_drivers.abudget``)."""

from __future__ import annotations

import threading

from .._core.budget import LoadBudget, new_budget, refuse_another_size
from .._core.config import Settings


class Budgets:
    def __init__(self, namespace: str, max_key_length: int) -> None:
        self._namespace = namespace
        self._max_key_length = max_key_length
        self._by_name: dict[str, tuple[LoadBudget, threading.BoundedSemaphore]] = {}
        self._lock = threading.Lock()

    def get(self, name: str, settings: Settings) -> tuple[LoadBudget, threading.BoundedSemaphore]:
        """The budget ``name`` and its per-process count; a ConfigError if it exists with
        another size than ``settings.max_concurrent_loads``."""
        with self._lock:
            found = self._by_name.get(name)
            if found is None:
                budget = new_budget(self._namespace, self._max_key_length, name, settings)
                found = self._by_name[name] = (budget, threading.BoundedSemaphore(budget.slots))
        refuse_another_size(found[0], settings.max_concurrent_loads)
        return found
