# Generated from aeach.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""The many-key commands of a store that sends one command per entry: the embedded
store, whose commands are steps in memory with no round trip to save, and PostgreSQL,
which reads a page in one statement (its own ``get_many``) but takes leases and writes
one entry at a time (a round trip each: its many-entry statements are not written yet).

A many-key command answers each entry as its single-key command would, a failure of an
entry's command as its ``BackendUnavailable`` in place (``_core.store.Store.acquire_many``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .._core.keys import EntryKeys
from .._core.store import AcquireCall, AcquireReply, Subscription, WriteCall, Written
from .._errors import BackendUnavailable


class OneByOne:
    """``Store``'s many-key commands, one single-key command per entry."""

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self.get(key) for key in keys]  # type: ignore[attr-defined]

    def get_many_with_ttl(self, keys: Sequence[str], failing: bool = False) -> list[tuple[bytes | None, float, bool]]:
        return [self.get_with_ttl(key, failing) for key in keys]  # type: ignore[attr-defined]

    def acquire_many(self, calls: Sequence[AcquireCall]) -> list[AcquireReply | BackendUnavailable]:
        replies: list[AcquireReply | BackendUnavailable] = []
        for call in calls:
            try:
                replies.append(self.acquire(*call))  # type: ignore[attr-defined]
            except BackendUnavailable as error:
                replies.append(error)
        return replies

    def write_release_many(self, calls: Sequence[WriteCall]) -> list[Written | BackendUnavailable]:
        replies: list[Written | BackendUnavailable] = []
        for call in calls:
            try:
                replies.append(self.write_release(*call))  # type: ignore[attr-defined]
            except BackendUnavailable as error:
                replies.append(error)
        return replies

    def subscribe_many(self, keys: Sequence[EntryKeys]) -> Sequence[Subscription | BackendUnavailable]:
        subscriptions: list[Subscription] = []
        try:
            for entry in keys:
                subscriptions.append(self.subscribe(entry))  # type: ignore[attr-defined]
        except BaseException:
            for subscription in subscriptions:
                subscription.close()
            raise
        return subscriptions
