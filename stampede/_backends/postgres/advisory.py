"""PostgreSQL's own session lock (``pg_advisory_lock``), for a layer whose store is
PostgreSQL: what ``layer.advisory_lock()`` returns. See ``stampede.postgres``."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.errors

from ..._errors import BackendUnavailable, ConfigError, LockLost, LockNotOwned, WaitTimeout

__all__ = ["AdvisoryLock", "advisory_key"]


def advisory_key(namespace: str, name: str) -> int:
    """The lock's 64-bit key: the namespace and name hashed (no two names share a key
    unless 64 bits collide)."""
    digest = hashlib.blake2b(f"{namespace}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _wait_settings(timeout: float | None) -> tuple[str, tuple[str, ...]]:
    """The statement that sets this transaction's lock wait (0: none) and lifts the
    pool's statement timeout for it."""
    wait = "0" if timeout is None else f"{max(1, int(timeout * 1000))}ms"
    return "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', '0', true)", (wait,)


class AdvisoryLock:
    """A session-level ``pg_advisory_lock`` held on one connection of the layer's pool
    (blocking callers: ``acquire``/``release``/``with``, tasks: ``aacquire``/``arelease``/
    ``async with``, on the event loop's pool). ``blocking=False`` tries once
    (``pg_try_advisory_lock``). ``timeout`` bounds a blocking wait (None: no limit)."""

    def __init__(
        self,
        namespace: str,
        name: str,
        pool: Any,
        loop_pool: Callable[[], Any] | None,
        *,
        blocking: bool = True,
        timeout: float | None = None,
    ) -> None:
        """``pool``: the layer's blocking pool (None: no blocking store). ``loop_pool``:
        a function giving this event loop's (None: no asyncio store). The layer's
        ``advisory_lock()`` passes both."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a lock name must be a non-empty str, got {name!r}")
        self.name = name
        self.key = advisory_key(namespace, name)
        self.blocking = blocking
        self.timeout = timeout
        self._blocking_pool = pool
        self._loop_pool = loop_pool
        self._connection: Any = None  # the connection holding it, while held
        self._pool: Any = None

    def _refused(self) -> WaitTimeout:
        return WaitTimeout(f"could not acquire advisory lock {self.name!r} within {self.timeout} s", key=self.name)

    def acquire(self) -> bool:
        """Take the lock: True once held. False if ``blocking=False`` and it is taken.
        ``WaitTimeout`` after ``timeout``. ``BackendUnavailable`` if the database fails."""
        if self._connection is not None:
            raise LockNotOwned(f"advisory lock {self.name!r} is already held by this object", key=self.name)
        pool = self._blocking_pool
        if pool is None:
            raise ConfigError("acquire() needs a blocking store: use aacquire()")
        try:
            connection = pool.getconn(timeout=pool.timeout)
        except psycopg.Error as error:
            raise BackendUnavailable(f"no connection to take advisory lock {self.name!r}: {error}") from error
        try:
            if self.blocking:
                with connection.transaction():
                    connection.execute(*_wait_settings(self.timeout))
                    connection.execute("SELECT pg_advisory_lock(%s)", (self.key,))
                taken = True
            else:
                row = connection.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
                taken = bool(row and row[0])
        except psycopg.errors.LockNotAvailable:
            pool.putconn(connection)
            raise self._refused() from None
        except psycopg.Error as error:
            pool.putconn(connection)
            raise BackendUnavailable(f"postgresql failed to take advisory lock {self.name!r}: {error}") from error
        if not taken:
            pool.putconn(connection)
            return False
        self._connection, self._pool = connection, pool
        return True

    def release(self) -> None:
        """Release it. ``LockLost`` if the session holding it ended meanwhile (the
        database freed it then, and another holder may have overlapped)."""
        connection, pool = self._connection, self._pool
        if connection is None:
            raise LockNotOwned(f"advisory lock {self.name!r} is not held by this object", key=self.name)
        self._connection = self._pool = None
        try:
            row = connection.execute("SELECT pg_advisory_unlock(%s)", (self.key,)).fetchone()
        except psycopg.Error as error:
            raise LockLost(f"the session holding advisory lock {self.name!r} ended: {error}", key=self.name) from error
        finally:
            pool.putconn(connection)
        if not (row and row[0]):
            raise LockLost(f"advisory lock {self.name!r} was not held by its session any more", key=self.name)

    async def aacquire(self) -> bool:
        """``acquire()`` for a task, on this event loop's pool."""
        if self._connection is not None:
            raise LockNotOwned(f"advisory lock {self.name!r} is already held by this object", key=self.name)
        if self._loop_pool is None:
            raise ConfigError("aacquire() needs an asyncio store: use acquire()")
        pool = self._loop_pool()  # this loop's connections (``_backends.postgres.pools.AsyncConnections``)
        try:
            connection = await pool.getconn(timeout=pool.timeout)
        except psycopg.Error as error:
            raise BackendUnavailable(f"no connection to take advisory lock {self.name!r}: {error}") from error
        try:
            if self.blocking:
                async with connection.transaction():
                    await connection.execute(*_wait_settings(self.timeout))
                    await connection.execute("SELECT pg_advisory_lock(%s)", (self.key,))
                taken = True
            else:
                row = await (await connection.execute("SELECT pg_try_advisory_lock(%s)", (self.key,))).fetchone()
                taken = bool(row and row[0])
        except psycopg.errors.LockNotAvailable:
            await pool.putconn(connection)
            raise self._refused() from None
        except BaseException as error:  # a cancelled wait too: the connection goes back
            await pool.putconn(connection)
            if isinstance(error, psycopg.Error):
                raise BackendUnavailable(f"postgresql failed to take advisory lock {self.name!r}: {error}") from error
            raise
        if not taken:
            await pool.putconn(connection)
            return False
        self._connection, self._pool = connection, pool
        return True

    async def arelease(self) -> None:
        """``release()`` for a task."""
        connection, pool = self._connection, self._pool
        if connection is None:
            raise LockNotOwned(f"advisory lock {self.name!r} is not held by this object", key=self.name)
        self._connection = self._pool = None
        try:
            row = await (await connection.execute("SELECT pg_advisory_unlock(%s)", (self.key,))).fetchone()
        except psycopg.Error as error:
            raise LockLost(f"the session holding advisory lock {self.name!r} ended: {error}", key=self.name) from error
        finally:
            await pool.putconn(connection)
        if not (row and row[0]):
            raise LockLost(f"advisory lock {self.name!r} was not held by its session any more", key=self.name)

    def __enter__(self) -> AdvisoryLock:
        if not self.acquire():
            raise self._refused()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    async def __aenter__(self) -> AdvisoryLock:
        if not await self.aacquire():
            raise self._refused()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.arelease()

    def __repr__(self) -> str:
        return (
            f"<stampede.postgres.AdvisoryLock {self.name!r} {'held' if self._connection is not None else 'not held'}>"
        )
