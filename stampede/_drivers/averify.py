"""Verifying hits (``verify_sample``, ``_core.verify``): a sampled hit's entry loaded
again in the background and compared with what was served, one per key in this process
(event loop), a few at once.
"""

# verify.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
# UNASYNC: self._state() -> self.state
from __future__ import annotations

import asyncio
import functools

# SYNC: import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._core.flow import (
    LoaderSpec,
)
from .._core.verify import (
    EVENT_OF,
    Result,
    agrees,
    log_mismatch,
    mark_verifying,
    unchanged,
    unmark_verifying,
    verification_failed,
)
from .adrive import AsyncDriving
from .many import aone_of
from .near import NearCache
from .state import AsyncState


class AsyncVerifying(AsyncDriving):
    """Starts and performs the verifications of sampled hits."""

    def _verify(
        self, state: AsyncState, value_key: str, spec: LoaderSpec, reload: Callable[[], Awaitable[Any]], raw: bytes
    ) -> None:
        """Start the verification of a hit that served the envelope ``raw``
        (``_core.verify``): one per key in this process (event loop), a few at once. A
        hit of the same envelope meanwhile shares its verdict."""
        leads = state.verdicts.join(value_key, raw)
        if leads is None:  # another envelope of the key is being verified
            self._events.incr("consistency_skipped")
        elif leads:
            work = functools.partial(self._verification, state, value_key, spec, reload, raw)
            if not state.verifier.start(value_key, work):  # at the limit of verifications at once
                self._events.incr("consistency_skipped", state.verdicts.done(value_key))

    def _verify_near(
        self, near: NearCache, value_key: str, spec: LoaderSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """``_verify`` of a near-cache hit, whose envelope is the copy's."""
        raw = near.raw(value_key)
        if raw is not None:
            self._verify(self._state(), value_key, spec, functools.partial(spec.func, *args, **kwargs), raw)

    def _verify_entry(
        self,
        state: AsyncState,
        keys: Sequence[str],
        spec: LoaderSpec,
        load: Callable[[list[int]], Awaitable[list[Any]]],
        index: int,
        raw: bytes | None,
    ) -> None:
        """``_verify`` of the hit at ``index`` of a many-key call (one at most per call):
        the loader is asked for that id alone."""
        if raw is not None:
            self._verify(state, keys[index], spec, aone_of(spec, load, index).func, raw)

    async def _verification(
        self, state: AsyncState, value_key: str, spec: LoaderSpec, reload: Callable[[], Awaitable[Any]], raw: bytes
    ) -> None:
        """Load the entry again, compare, and count the result (``_core.verify``)."""
        codec = spec.codec
        token = mark_verifying()
        result: Result = "error"
        try:
            result = "match"
            if not agrees(codec, raw, await reload(), spec.verify_equal, value_key):
                result = "superseded"
                if unchanged(codec, raw, await state.store.get(value_key)):
                    state.verifier.release()  # the wait asks nothing of the database (``_core.verify``)
                    await asyncio.sleep(spec.settings.verify_grace)  # a writer's invalidation on its way
                    if unchanged(codec, raw, await state.store.get(value_key)):
                        result = "mismatch"
        except Exception as error:
            result = "error"
            verification_failed(value_key, spec.name, spec.settings.trace_keys, error)
        finally:
            unmark_verifying(token)
            hits = state.verdicts.done(value_key)  # cancelled (the loop's state closes): none counted
        if result == "mismatch":
            log_mismatch(self._warn, value_key, spec.name, spec.settings.trace_keys)
        self._events.incr(EVENT_OF[result], hits)
