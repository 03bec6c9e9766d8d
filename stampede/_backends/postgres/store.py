# Generated from astore.py by .ci/unasync.py: do not edit.
# Edit the asyncio source, then run `python .ci/unasync.py`.
"""The PostgreSQL store: entries, leases, queues and wake-ups in the database.

Every statement is one call of a function of ``schema`` (or one plain statement), so
each store method is one round trip, atomic in the database, as a Lua script is in
Redis. The blocking store takes connections from a psycopg ``ConnectionPool``, each
event loop's store from a few of its own (``pools``). Waiters sleep on the
process's one ``PostgresListener`` (``listener``), which the blocking store owns. The
schema is created on first use, by any store, under an advisory lock; a database that
lost it (dropped, recreated) gets it again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.errors

from ..._core.keys import EntryKeys, check_key, entry_value_keys, failing_key
from ..._core.store import AcquireReply, Roles, Subscription, Written
from ..._core.tags import Tagged, TagKeys
from ..._core.versions import saw_versions
from ..._errors import BackendUnavailable
from ..breaker import CircuitBreaker
from ..each import OneByOne
from ..mailbox import ThreadMailbox
from ..steps import put_in_steps
from . import schema as sql
from .listener import PostgresListener
from .pools import (
    DEADLOCK_PAUSE,
    DEADLOCK_TRIES,
    SCHEMA_LOST,
    SWEEP_BATCH,
    Connections,
    Sweeper,
    failure,
    log,
    schema_ready,
)


class PostgresStore(OneByOne):
    """A store in a PostgreSQL database, over ``pool``. It closes the pool on close if
    ``owns_pool``. Its budgets' slots read the entries' leases, rows of the same database."""

    optional_roles = Roles.BUDGETS | Roles.HOT_SETS | Roles.SLOT_LEASES

    def __init__(
        self,
        pool: Connections,
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

    @contextmanager
    def connection(self, what: str, key: str) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool, its statements' failures translated (``failure``)."""
        self.breaker.check(key)
        try:
            with self.pool.connection(timeout=self._timeout) as connection:
                if not self._schema_ready:
                    self._create_schema(connection)
                yield connection
        except SCHEMA_LOST as error:
            self._schema_ready = False  # the next statement creates it again
            raise failure(self.breaker, what, key, error) from error
        except psycopg.Error as error:
            raise failure(self.breaker, what, key, error) from error
        self.breaker.succeeded()

    def _create_schema(self, connection: psycopg.Connection[Any]) -> None:
        """Create the schema unless this version of it is there (see ``SCHEMA_VERSION``).
        Stores that race here wait for each other on the advisory lock, then find it."""
        if not schema_ready((connection.execute(sql.SCHEMA_READY)).fetchone()):
            with connection.transaction():
                connection.execute(sql.SCHEMA_LOCK)
                if not schema_ready((connection.execute(sql.SCHEMA_READY)).fetchone()):
                    connection.execute(sql.SCHEMA)
        self._schema_ready = True

    def _one(self, what: str, key: str, statement: sql.Statement) -> tuple[Any, ...] | None:
        with self.connection(what, key) as connection:
            cursor = self._execute(connection, statement)
            row: tuple[Any, ...] | None = cursor.fetchone()
        return row

    def _count(self, what: str, key: str, statement: sql.Statement) -> int:
        with self.connection(what, key) as connection:
            cursor = self._execute(connection, statement)
        return cursor.rowcount

    def _execute(self, connection: psycopg.Connection[Any], statement: sql.Statement) -> psycopg.Cursor[Any]:
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
                return connection.execute(statement.query, statement.params)
            except psycopg.errors.DeadlockDetected:
                log.info("stampede: PostgreSQL broke a deadlock by aborting a statement; running it again")
                time.sleep(DEADLOCK_PAUSE * (attempt + 1) * random.uniform(1.0, 2.0))
        return connection.execute(statement.query, statement.params)

    def get(self, key: str) -> bytes | None:
        row = self._one("read", key, sql.Statement(sql.GET, (key,)))
        return None if row is None else bytes(row[0])

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of ``keys`` in one statement (``OneByOne`` sends the rest one by one)."""
        with self.connection("read", keys[0]) as connection:
            cursor = connection.execute(sql.GET_MANY, (list(keys),))
            rows = cursor.fetchall()
        found = {key: bytes(value) for key, value in rows}
        return [found.get(key) for key in keys]

    def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]:
        row = self._one("read", key, sql.get_with_ttl(key, failing_key(key)))
        if row is None:
            return None, 0.0, False
        return bytes(row[0]), float(row[1]), failing and bool(row[2])

    def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b"", clock: str = ""
    ) -> AcquireReply:
        statement = sql.acquire(keys, token, lease_ms, check_value, stale, clock=bool(clock))
        return sql.acquire_reply(self._one("lock", keys.value, statement))

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return self._count("renew the lease of", keys.value, sql.renew(keys, token, lease_ms)) == 1

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        statement = (
            sql.write_release(keys, token, envelope, ttl_ms, inline)
            if tagged is None
            else sql.write_tagged(keys, token, envelope, ttl_ms, inline, tagged)
        )
        with self.connection("write", keys.value) as connection:
            row = (self._execute(connection, statement)).fetchone()
            if self._sweeper.due():
                try:
                    connection.execute(sql.SWEEP, (SWEEP_BATCH,))
                except psycopg.Error as error:  # the write stands (autocommit). The next sweep tries again
                    log.info("stampede: sweeping expired rows failed (%s)", error)
        return Written(row[0] if row else -1)

    def touch(self, keys: EntryKeys, token: str, identity: bytes, ttl_ms: int) -> Written:
        """Release the lease, then keep the value, in one transaction: the waiters it wakes
        (at the commit) read the value kept."""
        released, kept = sql.release(keys, token), sql.keep(keys, identity, ttl_ms)
        with self.connection("keep", keys.value) as connection, connection.transaction():
            row = (connection.execute(released.query, released.params)).fetchone()
            if not (row and row[0]):
                return Written.REFUSED
            if not (connection.execute(kept.query, kept.params)).rowcount:
                return Written.REFUSED
            forget = sql.forget_failing(keys)
            connection.execute(forget.query, forget.params)
        return Written.YES

    def release(self, keys: EntryKeys, token: str) -> bool:
        row = self._one("release the lease of", keys.value, sql.release(keys, token))
        return bool(row and row[0])

    def hold(self, keys: EntryKeys, token: str, hold_ms: int, failing_ms: int) -> bool:
        row = self._one("hold", keys.value, sql.hold(keys, token, hold_ms, failing_ms))
        return bool(row and row[0])

    def expire(self, keys: EntryKeys) -> None:
        _seen(keys, self._one("expire", keys.value, sql.invalidate(keys, keep_stale=True)))

    def mark_versioned(self, keys: Sequence[EntryKeys], marker_ms: int) -> None:
        if keys:
            self._count("mark", keys[0].value, sql.mark_versioned(keys, marker_ms))

    def tag_clock(self, key: str) -> int:
        """The database's one tag clock (a sequence): ``key`` names the namespace's on Redis."""
        row = self._one("read the tag clock", key, sql.Statement(sql.TAG_CLOCK, ()))
        return int(row[0]) if row else 0

    def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]:
        statement = sql.invalidate_tag(tag, keep_stale=soft)
        with self.connection("invalidate the tag", tag.members) as connection:
            rows = (connection.execute(statement.query, statement.params)).fetchall()
        return [key for (key,) in rows]

    def entry_tags(self, keys: EntryKeys) -> list[str] | None:
        raw = self.get(keys.tags) if self.get(keys.value) is not None else None
        return None if raw is None else raw.decode().split(" ")

    def invalidate(self, keys: EntryKeys) -> None:
        _seen(keys, self._one("invalidate", keys.value, sql.invalidate(keys, keep_stale=False)))

    def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        """``invalidate``, and the lease taken for ``token``, in one function
        (``stampede_seize``): the waiters it wakes (at the commit) find the lease taken,
        and its rows are locked in the order every writer of the entry locks them."""
        _seen(keys, self._one("invalidate", keys.value, sql.seize(keys, token, lease_ms)))

    def put(
        self, keys: EntryKeys, token: str, lease_ms: int, envelope: bytes, ttl_ms: int, inline: bool,
        tagged: Tagged | None = None,
    ) -> Written:  # fmt: skip
        """``seize``, then ``write_release``: two statements, each locking the entry's rows
        in the order every writer locks them."""
        return put_in_steps(self, keys, token, lease_ms, envelope, ttl_ms, inline, tagged)

    def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        statement = sql.take_lock(keys, token, lease_ms, queue_ms)
        return sql.take_lock_reply(self._one("take the lock", keys.value, statement))

    def leave_queue(self, keys: EntryKeys, token: str) -> None:
        self._one("leave the queue of", keys.value, sql.leave_queue(keys, token))

    def note_hot(self, key: str, counts: Mapping[bytes, int], limit: int, ttl_ms: int) -> None:
        if counts:
            self._one("record the hot set", key, sql.note_hot(key, counts, limit, ttl_ms))

    def hot_members(self, key: str, count: int) -> list[tuple[bytes, float]]:
        with self.connection("read the hot set", key) as connection:
            cursor = self._execute(connection, sql.Statement(sql.HOT_MEMBERS, (key, count)))
            rows = cursor.fetchall()
        return [(bytes(member), float(score)) for member, score in rows]

    def take_slot(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int) -> AcquireReply:
        statement = sql.take_slot(keys, token, lease_ms, queue_ms, slots)
        return sql.take_slot_reply(self._one("take a slot of", keys.value, statement))

    def take_slot_for(
        self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int, slots: int, entry: EntryKeys, lease: str
    ) -> AcquireReply:
        statement = sql.take_slot_for(keys, token, lease_ms, queue_ms, slots, entry, lease)
        return sql.take_slot_reply(self._one("take a slot of", keys.value, statement))

    def renew_slot(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        row = self._one("renew a slot of", keys.value, sql.renew_slot(keys, token, lease_ms))
        return row is not None and bool(row[0])

    def release_slot(self, keys: EntryKeys, token: str, slots: int, lease_ms: int) -> bool:
        row = self._one("release a slot of", keys.value, sql.release_slot(keys, token, slots, lease_ms))
        return row is not None and bool(row[0])

    def holder(self, keys: EntryKeys) -> str | None:
        row = self._one("read the holder of", keys.value, sql.holder(keys))
        return None if row is None else str(row[0])

    def subscribe(self, keys: EntryKeys) -> Subscription:
        """A mailbox on the entry's channel, confirmed by its fence (``PostgresListener``)."""
        subscription = ThreadMailbox(keys.channel, self.listener.detach)
        fence = self.listener.join(subscription)
        try:
            if fence is not None:
                self._one("subscribe to", keys.value, sql.fence(fence))
            if not subscription.wait_confirmed(self.listener.timeout):
                raise BackendUnavailable(
                    f"cannot listen for wake-ups on {keys.channel!r}: the database does not answer"
                )
        except BaseException:
            subscription.close()
            raise
        return subscription

    def check(self, namespace: str) -> None:
        """Raise ``BackendUnavailable`` naming the cause unless the database answers and
        takes writes (a wrong password, a read-only standby, a user without the rights
        to create the schema all fail here)."""
        key = check_key(namespace)
        with self.connection("check the database with", key) as connection:
            connection.execute(sql.CHECK, (key,))
            connection.execute(sql.CHECK_DELETE, (key,))

    def scan(self, namespace: str, match: str = "*") -> set[str]:
        statement = sql.scan(namespace, match)
        with self.connection("scan", namespace) as connection:
            rows = (connection.execute(statement.query, statement.params)).fetchall()
        return entry_value_keys(row[0] for row in rows)

    def close(self) -> None:
        self.listener.close()
        if self._owns_pool:
            self.pool.close()


def _seen(keys: EntryKeys, row: tuple[Any, ...] | None) -> None:
    """Report a versioned mark an invalidation's, an expiry's or a seizure's row found on
    the entry (``_core.versions.saw_versions``)."""
    if row is not None and row[-1]:
        saw_versions(keys.value)
