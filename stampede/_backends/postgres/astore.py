"""The PostgreSQL backend for asyncio callers: the same statements as ``postgres`` over
psycopg 3's ``AsyncConnection``, a few of the event loop's own (``LoopConnections``).
Wake-ups come from the process's one ``PostgresListener`` (a thread), which hands each
to the waiter's loop. The blocking store of the layer owns it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool, PoolTimeout

from ..._core.keys import EntryKeys, check_key, entry_value_keys, failing_key
from ..._core.store import AcquireReply, AsyncSubscription, Written
from ..._core.tags import Tagged, TagKeys
from ..._errors import BackendUnavailable
from ..breaker import CircuitBreaker
from ..each import AsyncOneByOne
from ..mailbox import LoopMailbox
from . import schema as sql
from .store import (
    SCHEMA_LOST,
    SWEEP_BATCH,
    PostgresListener,
    PostgresStore,
    Sweeper,
    acquire_reply,
    connection_settings,
    failure,
    log,
    schema_ready,
    take_lock_reply,
)

IDLE = TransactionStatus.IDLE


class LoopConnections:
    """This event loop's connections to the database: at most ``size`` at once, made when
    needed and kept while idle, every one in autocommit. No background task: psycopg's
    asyncio pool runs workers that ``asyncio.run`` cancels before the layer's store can
    close (``_drivers.aio`` closes it while the loop finalizes its async generators), and a
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
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        connection = await self.getconn()
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


class AsyncPostgresStore(AsyncOneByOne):
    """An ``AsyncStore`` in a PostgreSQL database, for the tasks of one event loop."""

    def __init__(
        self,
        conninfo: str,
        settings: dict[str, Any],
        max_connections: int,
        breaker: CircuitBreaker,
        listener: PostgresListener,
        timeout: float,
    ) -> None:
        self.pool = LoopConnections(conninfo, settings, max_connections, timeout)
        self.breaker = breaker
        self.listener = listener
        self._schema_ready = False
        self._sweeper = Sweeper()

    @asynccontextmanager
    async def _connection(self, what: str, key: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        self.breaker.check(key)
        try:
            async with self.pool.connection() as connection:
                if not self._schema_ready:
                    await self._create_schema(connection)
                yield connection
        except SCHEMA_LOST as error:
            self._schema_ready = False
            raise failure(self.breaker, what, key, error) from error
        except psycopg.Error as error:
            raise failure(self.breaker, what, key, error) from error
        self.breaker.succeeded()

    async def _create_schema(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """Create the schema unless this version of it is there (see ``SCHEMA_VERSION``)."""
        if not schema_ready(await (await connection.execute(sql.SCHEMA_READY)).fetchone()):
            async with connection.transaction():
                await connection.execute(sql.SCHEMA_LOCK)
                if not schema_ready(await (await connection.execute(sql.SCHEMA_READY)).fetchone()):
                    await connection.execute(sql.SCHEMA)
        self._schema_ready = True

    async def _one(self, what: str, key: str, statement: sql.Statement) -> tuple[Any, ...] | None:
        async with self._connection(what, key) as connection:
            cursor = await connection.execute(statement.query, statement.params)
            row: tuple[Any, ...] | None = await cursor.fetchone()
        return row

    async def get(self, key: str) -> bytes | None:
        row = await self._one("read", key, sql.Statement(sql.GET, (key,)))
        return None if row is None else bytes(row[0])

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """``PostgresStore.get_many``, awaited."""
        async with self._connection("read", keys[0]) as connection:
            cursor = await connection.execute(sql.GET_MANY, (list(keys),))
            rows = await cursor.fetchall()
        found = {key: bytes(value) for key, value in rows}
        return [found.get(key) for key in keys]

    async def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]:
        row = await self._one("read", key, sql.get_with_ttl(key, failing_key(key)))
        if row is None:
            return None, 0.0, False
        return bytes(row[0]), float(row[1]), failing and bool(row[2])

    async def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b""
    ) -> AcquireReply:
        statement = sql.acquire(keys, token, lease_ms, check_value, stale)
        return acquire_reply(await self._one("lock", keys.value, statement))

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        statement = sql.renew(keys, token, lease_ms)
        async with self._connection("renew the lease of", keys.value) as connection:
            cursor = await connection.execute(statement.query, statement.params)
        return cursor.rowcount == 1

    async def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        statement = (
            sql.write_release(keys, token, envelope, ttl_ms, inline)
            if tagged is None
            else sql.write_tagged(keys, token, envelope, ttl_ms, inline, tagged)
        )
        async with self._connection("write", keys.value) as connection:
            row = await (await connection.execute(statement.query, statement.params)).fetchone()
            if self._sweeper.due():
                try:
                    await connection.execute(sql.SWEEP, (SWEEP_BATCH,))
                except psycopg.Error as error:  # the write stands (autocommit). The next sweep tries again
                    log.info("stampede: sweeping expired rows failed (%s)", error)
        return Written(row[0] if row else -1)

    async def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written:
        """``PostgresStore.touch``, awaited."""
        released, kept = sql.release(keys, token), sql.keep(keys, identity, ttl_ms)
        async with self._connection("keep", keys.value) as connection, connection.transaction():
            row = await (await connection.execute(released.query, released.params)).fetchone()
            if not (row and row[0]):
                return Written.REFUSED
            if not (await connection.execute(kept.query, kept.params)).rowcount:
                return Written.REFUSED
            forget = sql.forget_failing(keys)
            await connection.execute(forget.query, forget.params)
        return Written.YES

    async def release(self, keys: EntryKeys, token: str) -> bool:
        row = await self._one("release the lease of", keys.value, sql.release(keys, token))
        return bool(row and row[0])

    async def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        row = await self._one("hold", keys.value, sql.hold(keys, token, hold_ms, failing_ms))
        return bool(row and row[0])

    async def expire(self, keys: EntryKeys) -> None:
        await self._one("expire", keys.value, sql.invalidate(keys, keep_stale=True))

    async def tag_clock(self, key: str) -> int:
        """``PostgresStore.tag_clock``, awaited."""
        row = await self._one("read the tag clock", key, sql.Statement(sql.TAG_CLOCK, ()))
        return int(row[0]) if row else 0

    async def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]:
        statement = sql.invalidate_tag(tag, keep_stale=soft)
        async with self._connection("invalidate the tag", tag.members) as connection:
            rows = await (await connection.execute(statement.query, statement.params)).fetchall()
        return [key for (key,) in rows]

    async def entry_tags(self, keys: EntryKeys) -> list[str] | None:
        raw = await self.get(keys.tags) if await self.get(keys.value) is not None else None
        return None if raw is None else raw.decode().split(" ")

    async def invalidate(self, keys: EntryKeys) -> None:
        await self._one("invalidate", keys.value, sql.invalidate(keys, keep_stale=False))

    async def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        """``PostgresStore.seize``, awaited."""
        dropped, taken = sql.invalidate(keys, keep_stale=False), sql.acquire(keys, token, lease_ms, False, b"")
        async with self._connection("invalidate", keys.value) as connection, connection.transaction():
            await connection.execute(dropped.query, dropped.params)
            await connection.execute(taken.query, taken.params)

    async def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        statement = sql.take_lock(keys, token, lease_ms, queue_ms)
        return take_lock_reply(await self._one("take the lock", keys.value, statement))

    async def leave_queue(self, keys: EntryKeys, token: str) -> None:
        await self._one("leave the queue of", keys.value, sql.leave_queue(keys, token))

    async def holder(self, keys: EntryKeys) -> str | None:
        row = await self._one("read the holder of", keys.value, sql.holder(keys))
        return None if row is None else str(row[0])

    async def subscribe(self, keys: EntryKeys) -> AsyncSubscription:
        """``PostgresStore.subscribe``, awaited."""
        subscription = LoopMailbox(keys.channel, asyncio.get_running_loop(), self.listener.detach)
        fence = self.listener.join(subscription)
        try:
            if fence is not None:
                await self._one("subscribe to", keys.value, sql.fence(fence))
            if not await subscription.wait_confirmed(self.listener.timeout):
                raise BackendUnavailable(
                    f"cannot listen for wake-ups on {keys.channel!r}: the database does not answer"
                )
        except BaseException:
            subscription.close()
            raise
        return subscription

    async def check(self, namespace: str) -> None:
        key = check_key(namespace)
        async with self._connection("check the database with", key) as connection:
            await connection.execute(sql.CHECK, (key,))
            await connection.execute(sql.CHECK_DELETE, (key,))

    async def scan(self, namespace: str, match: str = "*") -> set[str]:
        statement = sql.scan(namespace, match)
        async with self._connection("scan", namespace) as connection:
            rows = await (await connection.execute(statement.query, statement.params)).fetchall()
        return entry_value_keys(row[0] for row in rows)

    async def aclose(self) -> None:
        await self.pool.close()


def make_pool(url: str, *, socket_timeout: float, connect_timeout: float, max_connections: int) -> ConnectionPool[Any]:
    """The pool a layer makes for a ``postgresql://`` URL: bounded, autocommit, with a
    statement timeout (``connection_settings``). A caller beyond it waits one socket
    timeout for a connection."""
    settings = connection_settings(socket_timeout, connect_timeout)
    return ConnectionPool(url, kwargs=settings, min_size=1, max_size=max_connections, open=True, timeout=socket_timeout)


def postgres_stores(
    pool: ConnectionPool[Any], breaker: CircuitBreaker, *, owns_pool: bool
) -> tuple[PostgresStore, Callable[[], AsyncPostgresStore]]:
    """A layer's blocking store over ``pool`` and its maker of each event loop's store,
    whose pool copies this one's conninfo, connection settings, size and timeout."""
    settings = dict(pool.kwargs) if isinstance(pool.kwargs, dict) else {}
    conninfo = pool.conninfo if isinstance(pool.conninfo, str) else ""
    listener = PostgresListener(conninfo, settings, pool.timeout)
    store = PostgresStore(pool, breaker, listener, pool.timeout, owns_pool=owns_pool)
    max_connections = pool.max_size

    def make() -> AsyncPostgresStore:
        return AsyncPostgresStore(conninfo, settings, max_connections, breaker, listener, pool.timeout)

    return store, make
