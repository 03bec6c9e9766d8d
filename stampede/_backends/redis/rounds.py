"""A round of Redlock: one command on every lock server, and the tally of their answers
(the store contract's ``Round``). Each server's failure is counted, not raised."""

from __future__ import annotations

from typing import Any

from ..._core.keys import EntryKeys
from ..._core.store import Round
from . import scripts as _scripts


class Server:
    """One server's client and scripts (blocking or asyncio alike)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.take = client.register_script(_scripts.ACQUIRE)
        self.release = client.register_script(_scripts.RELEASE)
        self.renew = client.register_script(_scripts.RENEW)


def take_on(server: Server, keys: EntryKeys, token: str, lease_ms: int) -> Any:
    return server.take(*_scripts.acquire_call(keys, token, lease_ms, check_value=False))


def release_on(server: Server, keys: EntryKeys, token: str) -> Any:
    return server.release(*_scripts.release_call(keys, token))


def renew_on(server: Server, keys: EntryKeys, token: str, lease_ms: int) -> Any:
    return server.renew(*_scripts.renew_call(keys, token, lease_ms))


def drop_on(server: Server, keys: EntryKeys) -> Any:
    return server.client.delete(keys.lock)


def holder_on(server: Server, keys: EntryKeys) -> Any:
    return server.client.get(keys.lock)


def tally_take(outcomes: list[Any]) -> Round:
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


def tally(outcomes: list[Any]) -> Round:
    failed = sum(isinstance(outcome, BaseException) for outcome in outcomes)
    return Round(sum(bool(o) for o in outcomes if not isinstance(o, BaseException)), failed)


def tokens(outcomes: list[Any]) -> list[bytes | None]:
    return [None if isinstance(outcome, BaseException) else outcome for outcome in outcomes]
