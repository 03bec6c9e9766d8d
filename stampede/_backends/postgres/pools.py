"""What the PostgreSQL stores sit on: the blocking store's psycopg pool (``make_pool``),
each event loop's own connections (``AsyncConnections``), the settings of every
connection, and the translation of psycopg's failures.

Every psycopg failure leaves the stores as ``BackendUnavailable``, which the flow turns
into policy. A failure to reach the server (``OperationalError``, a pool timeout) also
counts against the circuit breaker.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeAlias

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout

from ..._errors import BackendUnavailable
from ..breaker import CircuitBreaker

log = logging.getLogger("stampede.backend")

IDLE = TransactionStatus.IDLE

Connections: TypeAlias = "ConnectionPool[Any]"  # the blocking store's pool; AsyncConnections is a loop's

SWEEP_INTERVAL = 30.0  # seconds between two sweeps of expired rows, per store
SWEEP_BATCH = 1000  # rows of each table one sweep deletes at most
DEADLOCK_TRIES = 3  # runs of a statement PostgreSQL aborted to break a deadlock, at most
DEADLOCK_PAUSE = 0.02  # seconds before the second run (twice before the third), times 1 to 2 at random

SCHEMA_LOST = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction)


def failure(breaker: CircuitBreaker, what: str, key: str, error: BaseException) -> BackendUnavailable:
    """Tell the breaker about a failed statement (an error from a server that answered
    means the server is there), and translate the error."""
    unreachable = isinstance(error, (psycopg.OperationalError, OSError))
    breaker.failed(f"{type(error).__name__}: {error}") if unreachable else breaker.succeeded()
    timed_out = isinstance(error, (psycopg.errors.QueryCanceled, PoolTimeout, TimeoutError))
    return BackendUnavailable(f"postgresql failed to {what} {key!r}: {error}", key=key, timed_out=timed_out)


def schema_ready(row: tuple[Any, ...] | None) -> bool:
    """Whether ``SCHEMA_READY`` found this version of the schema."""
    return bool(row and row[0])


def connection_settings(url: str, socket_timeout: float, connect_timeout: float) -> dict[str, Any]:
    """What every connection of a store's own pool is made with: autocommit (each
    statement is its own transaction, so a NOTIFY goes out when the statement ends), a
    statement timeout, and a connect timeout (libpq counts whole seconds, at least 2).
    The statement timeout is added to the URL's own ``options`` (a ``search_path``, say),
    which a keyword would otherwise replace."""
    own = conninfo_to_dict(url).get("options") or ""
    return {
        "autocommit": True,
        "connect_timeout": max(2, math.ceil(connect_timeout)),
        "options": f"{own} -c statement_timeout={max(1, int(socket_timeout * 1000))}".lstrip(),
        "application_name": "stampede",
    }


class Sweeper:
    """When this store last swept expired rows. Due every ``SWEEP_INTERVAL`` seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()

    def due(self) -> bool:
        now = self._clock()
        if now - self._last < SWEEP_INTERVAL:
            return False
        self._last = now
        return True


def make_pool(url: str, *, socket_timeout: float, connect_timeout: float, max_connections: int) -> ConnectionPool[Any]:
    """The pool a layer makes for a ``postgresql://`` URL: bounded, autocommit, with a
    statement timeout (``connection_settings``). A caller beyond it waits one socket
    timeout for a connection."""
    settings = connection_settings(url, socket_timeout, connect_timeout)
    return ConnectionPool(url, kwargs=settings, min_size=1, max_size=max_connections, open=True, timeout=socket_timeout)


class AsyncConnections:
    """This event loop's connections to the database: at most ``size`` at once, made when
    needed and kept while idle, every one in autocommit. No background task: psycopg's
    asyncio pool runs workers that ``asyncio.run`` cancels before the layer's store can
    close (``_drivers.arunner`` closes it while the loop finalizes its async generators), and a
    worker cancelled mid-connect can keep the loop from ending. A connection that met an
    error (or a cancellation) mid-statement is closed, not reused."""

    def __init__(self, conninfo: str, settings: dict[str, Any], size: int, timeout: float) -> None:
        self._conninfo = conninfo
        self._settings = {**settings, "autocommit": True}
        self._slots = asyncio.Semaphore(size)
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self.timeout = timeout  # waiting for a slot, and for a new connection, at most
        self.closed = False

    async def getconn(self, timeout: float | None = None) -> psycopg.AsyncConnection[Any]:
        """A connection of this loop's own until ``putconn``. ``PoolTimeout`` after ``timeout``."""
        wait = self.timeout if timeout is None else timeout
        try:
            await asyncio.wait_for(self._slots.acquire(), wait)
        except asyncio.TimeoutError:
            raise PoolTimeout(f"no free connection to the database within {wait} s") from None
        try:
            while self._idle:
                connection = self._idle.pop()
                if not connection.closed:
                    return connection
            return await asyncio.wait_for(psycopg.AsyncConnection.connect(self._conninfo, **self._settings), wait)
        except asyncio.TimeoutError:
            self._slots.release()
            raise PoolTimeout(f"no connection to the database within {wait} s") from None
        except BaseException:
            self._slots.release()
            raise

    async def putconn(self, connection: psycopg.AsyncConnection[Any], broken: bool = False) -> None:
        """Give ``connection`` back: kept if it is clean and the pool open, else closed."""
        try:
            clean = not broken and not connection.closed and connection.info.transaction_status == IDLE
            if clean and not self.closed:
                self._idle.append(connection)
            else:
                await connection.close()
        finally:
            self._slots.release()

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection for the ``async with`` block (``ConnectionPool.connection``'s shape)."""
        connection = await self.getconn(timeout)
        try:
            yield connection
        except BaseException:
            await self.putconn(connection, broken=True)
            raise
        await self.putconn(connection)

    async def close(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.close()
