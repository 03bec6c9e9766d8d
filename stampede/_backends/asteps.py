"""A write-through (``put``) in two steps, for a store that cannot take them in one: the
seizure, then the write under the lease it took; the lease released if the write fails
or is interrupted (it may not have run), so that no lease is left held by a set that
raised. PostgreSQL's store, and a tagged set on a Redis Cluster, whose tags admit the
entry in their own slots between the two steps."""

# steps.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
from __future__ import annotations

import contextlib

from .._core.keys import EntryKeys
from .._core.store import AsyncStore, Written
from .._core.tags import Tagged
from .._errors import BackendUnavailable


async def put_in_steps(
    store: AsyncStore, keys: EntryKeys, token: str, lease_ms: int, envelope: bytes, ttl_ms: int, inline: bool,
    tagged: Tagged | None,
) -> Written:  # fmt: skip
    await store.seize(keys, token, lease_ms)
    try:
        return await store.write_release(keys, token, envelope, ttl_ms, inline, tagged)
    except BaseException:
        with contextlib.suppress(BackendUnavailable):
            await store.release(keys, token)
        raise
