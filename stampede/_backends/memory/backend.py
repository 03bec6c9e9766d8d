"""The embedded family's backend: everything in this process's memory (cachetools),
protection across threads and tasks only."""

from __future__ import annotations

import functools

from ..._core.backend import Backend, BackendOptions
from .store import AsyncMemoryStore, MemoryStore


def memory_backend(options: BackendOptions) -> Backend:
    """One store for threads, and a view of it for each event loop's tasks."""
    store = MemoryStore(options.max_entries)
    return Backend(
        name="memory",
        store=store,
        make_async_store=functools.partial(AsyncMemoryStore, store),
        in_process=True,
    )
