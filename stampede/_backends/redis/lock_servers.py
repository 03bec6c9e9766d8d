"""Redlock's lock servers over redis-py: each command goes to every server, blocking
callers one server after another, asyncio callers to all at once. Each server's failure
is counted in the ``Round``, not raised (the store contract's ``LockServers``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio

from ..._core.keys import EntryKeys
from ..._core.store import Round
from . import scripts as _scripts
from .store import FAILURES  # what a server's failure raises, blocking or asyncio: a refusal here


class _Server:
    """One server's client and scripts (blocking or asyncio alike)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.take = client.register_script(_scripts.ACQUIRE)
        self.release = client.register_script(_scripts.RELEASE)
        self.renew = client.register_script(_scripts.RENEW)


def _take(server: _Server, keys: EntryKeys, token: str, lease_ms: int) -> Any:
    return server.take(*_scripts.acquire_call(keys, token, lease_ms, check_value=False))


def _release(server: _Server, keys: EntryKeys, token: str) -> Any:
    return server.release(*_scripts.release_call(keys, token))


def _renew(server: _Server, keys: EntryKeys, token: str, lease_ms: int) -> Any:
    return server.renew(*_scripts.renew_call(keys, token, lease_ms))


def _drop(server: _Server, keys: EntryKeys) -> Any:
    return server.client.delete(keys.lock)


def _holder(server: _Server, keys: EntryKeys) -> Any:
    return server.client.get(keys.lock)


def _tally_take(outcomes: list[Any]) -> Round:
    granted = failed = 0
    leases: list[int] = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            failed += 1
        elif outcome[0] == 2:
            granted += 1
        elif int(outcome[1]) > 0:
            leases.append(int(outcome[1]))
    return Round(granted, failed, min(leases) / 1000 if leases else 0.0)


def _tally(outcomes: list[Any]) -> Round:
    failed = sum(isinstance(outcome, BaseException) for outcome in outcomes)
    return Round(sum(bool(o) for o in outcomes if not isinstance(o, BaseException)), failed)


def _tokens(outcomes: list[Any]) -> list[bytes | None]:
    return [None if isinstance(outcome, BaseException) else outcome for outcome in outcomes]


class RedisLockServers:
    """The lock servers for blocking callers: each command goes to one server after
    another, every failure counted rather than raised."""

    def __init__(self, clients: Sequence[redis.Redis]) -> None:
        self._servers = [_Server(client) for client in clients]

    def _everywhere(self, command: Callable[..., Any], *args: Any) -> list[Any]:
        outcomes: list[Any] = []
        for server in self._servers:
            try:
                outcomes.append(command(server, *args))
            except FAILURES as error:
                outcomes.append(error)
        return outcomes

    def take(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        return _tally_take(self._everywhere(_take, keys, token, lease_ms))

    def release(self, keys: EntryKeys, token: str) -> Round:
        return _tally(self._everywhere(_release, keys, token))

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        return _tally(self._everywhere(_renew, keys, token, lease_ms))

    def drop(self, keys: EntryKeys) -> Round:
        return _tally(self._everywhere(_drop, keys))

    def holders(self, keys: EntryKeys) -> list[bytes | None]:
        return _tokens(self._everywhere(_holder, keys))


class AsyncRedisLockServers:
    """The lock servers for the tasks of one event loop: each command goes to all of them
    at once. Owns its clients (``aclose``)."""

    def __init__(self, clients: Sequence[redis.asyncio.Redis]) -> None:
        self._servers = [_Server(client) for client in clients]

    async def _everywhere(self, command: Callable[..., Any], *args: Any) -> list[Any]:
        outcomes = await asyncio.gather(*(command(server, *args) for server in self._servers), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, FAILURES):
                raise outcome  # a bug or a cancellation, not a server's refusal
        return outcomes

    async def take(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        return _tally_take(await self._everywhere(_take, keys, token, lease_ms))

    async def release(self, keys: EntryKeys, token: str) -> Round:
        return _tally(await self._everywhere(_release, keys, token))

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> Round:
        return _tally(await self._everywhere(_renew, keys, token, lease_ms))

    async def drop(self, keys: EntryKeys) -> Round:
        return _tally(await self._everywhere(_drop, keys))

    async def holders(self, keys: EntryKeys) -> list[bytes | None]:
        return _tokens(await self._everywhere(_holder, keys))

    async def aclose(self) -> None:
        for server in self._servers:
            await server.client.aclose(close_connection_pool=True)
