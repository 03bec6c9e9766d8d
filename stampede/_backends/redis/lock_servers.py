# Generated from alock_servers.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""Redlock's lock servers over redis-py: each command goes to every server (blocking
callers one server after another, the tasks of a loop to all at once), each server's
failure counted in the ``Round``, not raised (the store contract's ``LockServers``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis

from ..._core.keys import EntryKeys
from ..._core.store import Round
from .commands import FAILURES  # what a server's failure raises, blocking or asyncio: a refusal here
from .rounds import Server, drop_on, holder_on, release_on, renew_on, take_on, tally, tally_take, tokens


class RedisLockServers:
    """The lock servers: every failure counted rather than raised."""

    def __init__(self, clients: Sequence[redis.Redis]) -> None:
        self._servers = [Server(client) for client in clients]

    def _everywhere(self, command: Callable[..., Any], *args: Any) -> list[Any]:
        outcomes: list[Any]
        outcomes = []
        for server in self._servers:
            try:
                outcomes.append(command(server, *args))
            except FAILURES as error:
                outcomes.append(error)
        return outcomes

    def take(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        return tally_take(self._everywhere(take_on, keys, token, lease_ms))

    def release(self, keys: EntryKeys, token: str) -> Round:
        return tally(self._everywhere(release_on, keys, token))

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        return tally(self._everywhere(renew_on, keys, token, lease_ms))

    def drop(self, keys: EntryKeys) -> Round:
        return tally(self._everywhere(drop_on, keys))

    def holders(self, keys: EntryKeys) -> list[bytes | None]:
        return tokens(self._everywhere(holder_on, keys))
