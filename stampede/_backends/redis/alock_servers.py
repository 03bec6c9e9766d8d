"""Redlock's lock servers over redis-py: each command goes to every server (blocking
callers one server after another, the tasks of a loop to all at once), each server's
failure counted in the ``Round``, not raised (the store contract's ``LockServers``)."""

# lock_servers.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio  # ASYNC

from ..._core.keys import EntryKeys
from ..._core.store import Round
from .commands import FAILURES  # what a server's failure raises, blocking or asyncio: a refusal here
from .rounds import Server, drop_on, holder_on, release_on, renew_on, take_on, tally, tally_take, tokens


class AsyncRedisLockServers:
    """The lock servers: every failure counted rather than raised."""

    def __init__(self, clients: Sequence[redis.asyncio.Redis]) -> None:
        self._servers = [Server(client) for client in clients]

    async def _everywhere(self, command: Callable[..., Any], *args: Any) -> list[Any]:
        outcomes: list[Any]
        if True:  # ASYNC
            outcomes = await asyncio.gather(
                *(command(server, *args) for server in self._servers), return_exceptions=True
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException) and not isinstance(outcome, FAILURES):
                    raise outcome  # a bug or a cancellation, not a server's refusal
        else:
            outcomes = []
            for server in self._servers:
                try:
                    outcomes.append(command(server, *args))
                except FAILURES as error:
                    outcomes.append(error)
        return outcomes

    async def take(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        return tally_take(await self._everywhere(take_on, keys, token, lease_ms))

    async def release(self, keys: EntryKeys, token: str) -> Round:
        return tally(await self._everywhere(release_on, keys, token))

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        return tally(await self._everywhere(renew_on, keys, token, lease_ms))

    async def drop(self, keys: EntryKeys) -> Round:
        return tally(await self._everywhere(drop_on, keys))

    async def holders(self, keys: EntryKeys) -> list[bytes | None]:
        return tokens(await self._everywhere(holder_on, keys))

    if True:  # ASYNC

        async def aclose(self) -> None:
            """Close the clients: a loop's own (the blocking ones are the layer's)."""
            for server in self._servers:
                await server.client.aclose(close_connection_pool=True)
