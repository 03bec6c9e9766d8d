"""The runner: what the loaders call (``_acached``), one module per job, each an asyncio
source whose blocking twin ``.ci/unasync.py`` makes (for threads, or greenlets under
gevent). Each builds on the one before:

    AsyncStates     where the state lives: one for the threads, one per event loop (``state``)
    AsyncDriving    a decision performed on a lease; a load without the lease (``adrive``)
    AsyncVerifying  sampled hits loaded again and compared (``averify``)
    AsyncOneKey     one key's call: hit path, singleflight, a miss filled (``aone_key``)
    AsyncManyKeys   many keys' call, the misses filled together (``amany_keys``)
    AsyncRunner     the controls: set, refresh, peek, invalidate, expire (this module)

The decisions are the core's (the flow, the flight, the controls). These modules only
perform I/O.
"""

# runner.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
# UNASYNC: self._state() -> self.state
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from .._core.controls import ano_load, peeked, put, reload
from .._core.flight import refuse_recursion
from .._core.flow import (
    LoaderSpec,
)
from .._core.keys import EntryKeys
from .._errors import BackendUnavailable
from .amany_keys import AsyncManyKeys


class AsyncRunner(AsyncManyKeys):
    """Runs calls of loaders, and the controls of their entries."""

    async def set(
        self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
    ) -> bool:
        """Write ``result`` over the entry, overtaking any load in flight (``controls.put``)."""
        ctx = self._context(value_key, spec, args, kwargs)
        return bool(await self._drive(put(ctx, result), ctx, ano_load, self._state()))

    async def refresh(self, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Load the entry now, shared with every refresh and miss of it at the same moment
        (``controls.reload``), and return the value."""
        refuse_recursion(value_key)
        ctx = self._context(value_key, spec, args, kwargs)
        return await self._drive(reload(ctx), ctx, functools.partial(spec.func, *args, **kwargs), self._state())

    async def peek(self, value_key: str, spec: LoaderSpec) -> tuple[Any, bool] | None:
        """What the entry holds that a caller could be served (``controls.peeked``)."""
        store = self._state().store
        if not spec.reads_ttl:
            return peeked(await store.get(value_key), -1.0, False, spec.codec, spec.settings)
        raw, ttl_left, failing = await store.get_with_ttl(value_key, True)
        return peeked(raw, ttl_left, failing, spec.codec, spec.settings)

    async def peek_many(self, keys: Sequence[str], spec: LoaderSpec) -> list[tuple[Any, bool] | None]:
        """``peek`` of each of ``keys``, in one round trip per server."""
        store = self._state().store
        codec, settings = spec.codec, spec.settings
        if not spec.reads_ttl:
            return [peeked(raw, -1.0, False, codec, settings) for raw in await store.get_many(keys)]
        reads = await store.get_many_with_ttl(keys, True)
        return [peeked(raw, ttl_left, failing, codec, settings) for raw, ttl_left, failing in reads]

    async def invalidate(self, keys: EntryKeys) -> None:
        await self._state().leases.invalidate(keys)

    async def mark_versioned(self, keys: list[EntryKeys], marker_ms: int) -> None:
        """A versioned load's mark on the entries of its loader without ``version=``, before
        its loader reads the database (``_core.versions``). A store that cannot take it is
        warned of, and the load goes on: its value is not written where the store is down,
        and elsewhere the mark is what an invalidation by the other side would miss."""
        try:
            await self._state().store.mark_versioned(keys, marker_ms)
        except BackendUnavailable as error:
            self._warn.warning(
                "stampede: a versioned load could not mark its entry (%s); an invalidation by a loader "
                "without version= may not reach what it writes (docs/deploys.md)",
                error,
                key=keys[0].value if keys else "",
                outcome="versions",
            )

    async def expire(self, keys: EntryKeys) -> None:
        await self._state().leases.expire(keys)
