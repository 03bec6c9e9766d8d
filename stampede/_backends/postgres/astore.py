"""The PostgreSQL store: entries, leases, queues and wake-ups in the database.

Every statement is one call of a function of ``schema`` (or one plain statement), so
each store method is one round trip, atomic in the database, as a Lua script is in
Redis. The blocking store takes connections from a psycopg ``ConnectionPool``, each
event loop's store from a few of its own (``pools``). Waiters sleep on the
process's one ``PostgresListener`` (``listener``), which the blocking store owns. The
schema is created on first use, by any store, under an advisory lock; a database that
lost it (dropped, recreated) gets it again.
"""

# store.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
from __future__ import annotations

import asyncio
import random

# SYNC: import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import psycopg.errors

from ..._core.keys import EntryKeys, check_key, entry_value_keys, failing_key
from ..._core.store import AcquireReply, AsyncSubscription, Roles, Written
from ..._core.tags import Tagged, TagKeys
from ..._core.versions import saw_versions
from ..._errors import BackendUnavailable
from ..aeach import AsyncOneByOne
from ..asteps import put_in_steps
from ..breaker import CircuitBreaker
from ..mailbox import LoopMailbox, ThreadMailbox
from . import schema as sql
from .listener import PostgresListener
from .pools import (
    DEADLOCK_PAUSE,
    DEADLOCK_TRIES,
    SCHEMA_LOST,
    SWEEP_BATCH,
    AsyncConnections,
    Sweeper,
    failure,
    log,
    schema_ready,
)


class AsyncPostgresStore(AsyncOneByOne):
    """A store in a PostgreSQL database, over ``pool``. It closes the pool on close if
    ``owns_pool``. Its budgets' slots read the entries' leases, rows of the same database."""

    optional_roles = Roles.BUDGETS | Roles.HOT_SETS | Roles.SLOT_LEASES

    def __init__(
        self,
        pool: AsyncConnections,
        breaker: CircuitBreaker,
        listener: PostgresListener,
        timeout: float,
        *,
        owns_pool: bool,
    ) -> None:
        self.pool = pool
        self.breaker = breaker
        self.listener = listener
        self._timeout = timeout  # waiting for a connection of the pool, at most
        self._owns_pool = owns_pool
        self._schema_ready = False
        self._sweeper = Sweeper()

    @asynccontextmanager
    async def connection(self, what: str, key: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection of the pool, its statements' failures translated (``failure``)."""
        self.breaker.check(key)
        try:
            async with self.pool.connection(timeout=self._timeout) as connection:
                if not self._schema_ready:
                    await self._create_schema(connection)
                yield connection
        except SCHEMA_LOST as error:
            self._schema_ready = False  # the next statement creates it again
            raise failure(self.breaker, what, key, error) from error
        except psycopg.Error as error:
            raise failure(self.breaker, what, key, error) from error
        self.breaker.succeeded()

    async def _create_schema(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """Create the schema unless this version of it is there (see ``SCHEMA_VERSION``).
        Stores that race here wait for each other on the advisory lock, then find it."""
        if not schema_ready(await (await connection.execute(sql.SCHEMA_READY)).fetchone()):
            async with connection.transaction():
                await connection.execute(sql.SCHEMA_LOCK)
                if not schema_ready(await (await connection.execute(sql.SCHEMA_READY)).fetchone()):
                    await connection.execute(sql.SCHEMA)
        self._schema_ready = True

    async def _one(self, what: str, key: str, statement: sql.Statement) -> tuple[Any, ...] | None:
        async with self.connection(what, key) as connection:
            cursor = await self._execute(connection, statement)
            row: tuple[Any, ...] | None = await cursor.fetchone()
        return row

    async def _count(self, what: str, key: str, statement: sql.Statement) -> int:
        async with self.connection(what, key) as connection:
            cursor = await self._execute(connection, statement)
        return cursor.rowcount

    async def _execute(
        self, connection: psycopg.AsyncConnection[Any], statement: sql.Statement
    ) -> psycopg.AsyncCursor[Any]:
        """Run one statement on its own (autocommit). A deadlock, which PostgreSQL breaks by
        aborting one of the statements in it, is run again: each statement is one function
        call that commits whole or not at all. The functions lock an entry's rows in one
        order (lease, then values), so stampede's own statements do not deadlock with
        each other (schema version 5's two-statement ``seize`` did, about once in 100,000
        calls under load: the history checker saw the lost write); this keeps a write from
        being lost to one with anything else that locks the rows.

        Not at once: the other transaction, woken by the abort, must first take the row
        it waited for. Run again before it has (a busy machine schedules it late), the
        statement retakes its own rows, waits for the other's again, and the deadlock
        comes back, each time (CI saw a write lost so, three tries in a row)."""
        for attempt in range(DEADLOCK_TRIES - 1):
            try:
                return await connection.execute(statement.query, statement.params)
            except psycopg.errors.DeadlockDetected:
                log.info("stampede: PostgreSQL broke a deadlock by aborting a statement; running it again")
                await asyncio.sleep(DEADLOCK_PAUSE * (attempt + 1) * random.uniform(1.0, 2.0))
        return await connection.execute(statement.query, statement.params)

    async def get(self, key: str) -> bytes | None:
        row = await self._one("read", key, sql.Statement(sql.GET, (key,)))
        return None if row is None else bytes(row[0])

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of ``keys`` in one statement (``OneByOne`` sends the rest one by one)."""
        async with self.connection("read", keys[0]) as connection:
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
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"", clock: str = ""
    ) -> AcquireReply:
        statement = sql.acquire(keys, token, lease_ms, check_value, stale, clock=bool(clock))
        return sql.acquire_reply(await self._one("lock", keys.value, statement))

    async def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return await self._count("renew the lease of", keys.value, sql.renew(keys, token, lease_ms)) == 1

    async def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        statement = (
            sql.write_release(keys, token, envelope, ttl_ms, inline)
            if tagged is None
            else sql.write_tagged(keys, token, envelope, ttl_ms, inline, tagged)
        )
        async with self.connection("write", keys.value) as connection:
            row = await (await self._execute(connection, statement)).fetchone()
            if self._sweeper.due():
                try:
                    await connection.execute(sql.SWEEP, (SWEEP_BATCH,))
                except psycopg.Error as error:  # the write stands (autocommit). The next sweep tries again
                    log.info("stampede: sweeping expired rows failed (%s)", error)
        return Written(row[0] if row else -1)

    async def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written:
        """Release the lease, then keep the value, in one transaction: the waiters it wakes
        (at the commit) read the value kept."""
        released, kept = sql.release(keys, token), sql.keep(keys, identity, ttl_ms)
        async with self.connection("keep", keys.value) as connection, connection.transaction():
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
        _seen(keys, await self._one("expire", keys.value, sql.invalidate(keys, keep_stale=True)))

    async def mark_versioned(self, keys: Sequence[EntryKeys], marker_ms: int) -> None:
        if keys:
            await self._count("mark", keys[0].value, sql.mark_versioned(keys, marker_ms))

    async def tag_clock(self, key: str) -> int:
        """The database's one tag clock (a sequence): ``key`` names the namespace's on Redis."""
        row = await self._one("read the tag clock", key, sql.Statement(sql.TAG_CLOCK, ()))
        return int(row[0]) if row else 0

    async def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]:
        statement = sql.invalidate_tag(tag, keep_stale=soft)
        async with self.connection("invalidate the tag", tag.members) as connection:
            rows = await (await connection.execute(statement.query, statement.params)).fetchall()
        return [key for (key,) in rows]

    async def entry_tags(self, keys: EntryKeys) -> list[str] | None:
        raw = await self.get(keys.tags) if await self.get(keys.value) is not None else None
        return None if raw is None else raw.decode().split(" ")

    async def invalidate(self, keys: EntryKeys) -> None:
        _seen(keys, await self._one("invalidate", keys.value, sql.invalidate(keys, keep_stale=False)))

    async def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        """``invalidate``, and the lease taken for ``token``, in one function
        (``stampede_seize``): the waiters it wakes (at the commit) find the lease taken,
        and its rows are locked in the order every writer of the entry locks them."""
        _seen(keys, await self._one("invalidate", keys.value, sql.seize(keys, token, lease_ms)))

    async def put(
        self, keys: EntryKeys, token: str, lease_ms: int, envelope: bytes, ttl_ms: int, inline: bool,
        tagged: Tagged | None = None,
    ) -> Written:  # fmt: skip
        """``seize``, then ``write_release``: two statements, each locking the entry's rows
        in the order every writer locks them."""
        return await put_in_steps(self, keys, token, lease_ms, envelope, ttl_ms, inline, tagged)

    async def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        statement = sql.take_lock(keys, token, lease_ms, queue_ms)
        return sql.take_lock_reply(await self._one("take the lock", keys.value, statement))

    async def leave_queue(self, keys: EntryKeys, token: str) -> None:
        await self._one("leave the queue of", keys.value, sql.leave_queue(keys, token))

    async def note_hot(self, key: str, counts: Mapping[bytes, int], limit: int, ttl_ms: int) -> None:
        if counts:
            await self._one("record the hot set", key, sql.note_hot(key, counts, limit, ttl_ms))

    async def hot_members(self, key: str, count: int) -> list[tuple[bytes, float]]:
        async with self.connection("read the hot set", key) as connection:
            cursor = await self._execute(connection, sql.Statement(sql.HOT_MEMBERS, (key, count)))
            rows = await cursor.fetchall()
        return [(bytes(member), float(score)) for member, score in rows]

    async def take_slot(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int) -> AcquireReply:
        statement = sql.take_slot(keys, token, lease_ms, queue_ms, slots)
        return sql.take_slot_reply(await self._one("take a slot of", keys.value, statement))

    async def take_slot_for(
        self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int, entry: EntryKeys, lease: str
    ) -> AcquireReply:
        statement = sql.take_slot_for(keys, token, lease_ms, queue_ms, slots, entry, lease)
        return sql.take_slot_reply(await self._one("take a slot of", keys.value, statement))

    async def renew_slot(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        row = await self._one("renew a slot of", keys.value, sql.renew_slot(keys, token, lease_ms))
        return row is not None and bool(row[0])

    async def release_slot(self, keys: EntryKeys, token: str, slots: int, lease_ms: int) -> bool:
        row = await self._one("release a slot of", keys.value, sql.release_slot(keys, token, slots, lease_ms))
        return row is not None and bool(row[0])

    async def holder(self, keys: EntryKeys) -> str | None:
        row = await self._one("read the holder of", keys.value, sql.holder(keys))
        return None if row is None else str(row[0])

    async def subscribe(self, keys: EntryKeys) -> AsyncSubscription:
        """A mailbox on the entry's channel, confirmed by its fence (``PostgresListener``)."""
        if True:  # ASYNC
            subscription = LoopMailbox(keys.channel, asyncio.get_running_loop(), self.listener.detach)
        else:
            subscription = ThreadMailbox(keys.channel, self.listener.detach)
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
        """Raise ``BackendUnavailable`` naming the cause unless the database answers and
        takes writes (a wrong password, a read-only standby, a user without the rights
        to create the schema all fail here)."""
        key = check_key(namespace)
        async with self.connection("check the database with", key) as connection:
            await connection.execute(sql.CHECK, (key,))
            await connection.execute(sql.CHECK_DELETE, (key,))

    async def scan(self, namespace: str, match: str = "*") -> set[str]:
        statement = sql.scan(namespace, match)
        async with self.connection("scan", namespace) as connection:
            rows = await (await connection.execute(statement.query, statement.params)).fetchall()
        return entry_value_keys(row[0] for row in rows)

    async def aclose(self) -> None:
        if True:  # ASYNC
            pass  # the listener is the blocking store's, which every loop's store shares
        else:
            self.listener.close()
        if self._owns_pool:
            await self.pool.close()


def _seen(keys: EntryKeys, row: tuple[Any, ...] | None) -> None:
    """Report a versioned mark an invalidation's, an expiry's or a seizure's row found on
    the entry (``_core.versions.saw_versions``)."""
    if row is not None and row[-1]:
        saw_versions(keys.value)
