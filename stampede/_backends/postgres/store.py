"""The PostgreSQL backend: the Store over a psycopg 3 connection pool, its listener of
wake-ups, and the translation of psycopg's failures.

Every statement is one call of a function of ``pg_schema`` (or one plain statement),
so each store method is one round trip, atomic in the database, as a Lua script is in
Redis. Waiters sleep on ``LISTEN``: one connection per process (``PostgresListener``)
hears every ``NOTIFY`` and hands each to the mailboxes of its entry. A lost connection
wakes them all to re-check (a spurious wake-up is always safe), and the listener
reconnects by itself. A wake-up carries no value: the woken waiter reads it (one round
trip more than Redis's inline message, and no payload limit to mind).

Every psycopg failure leaves this module as ``BackendUnavailable``, which the flow turns
into policy. A failure to reach the server (``OperationalError``, a pool timeout) also
counts against the circuit breaker. The schema is created on first use, by any store,
under an advisory lock. A database that lost it (dropped, recreated) gets it again.
"""

from __future__ import annotations

import itertools
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.errors
from psycopg_pool import ConnectionPool, PoolTimeout

from ..._core.keys import EntryKeys, check_key, entry_value_keys, failing_key
from ..._core.store import AcquireReply, LockState, Subscription, Written
from ..._core.tags import Tagged, TagKeys
from ..._errors import BackendUnavailable
from ..._fork import reset_after_fork
from ..breaker import CircuitBreaker
from ..channels import Mailbox, Waiting
from ..each import OneByOne
from ..mailbox import ThreadMailbox
from . import schema as sql

log = logging.getLogger("stampede.backend")
wakeups_log = logging.getLogger("stampede.wakeups")

SWEEP_INTERVAL = 30.0  # seconds between two sweeps of expired rows, per store
SWEEP_BATCH = 1000  # rows of each table one sweep deletes at most

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


def connection_settings(socket_timeout: float, connect_timeout: float) -> dict[str, Any]:
    """What every connection of a store's own pool is made with: autocommit (each
    statement is its own transaction, so a NOTIFY goes out when the statement ends), a
    statement timeout, and a connect timeout (libpq counts whole seconds, at least 2)."""
    return {
        "autocommit": True,
        "connect_timeout": max(2, math.ceil(connect_timeout)),
        "options": f"-c statement_timeout={max(1, int(socket_timeout * 1000))}",
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


class PostgresListener:
    """One connection that LISTENs for every store of the process on one database, and
    the mailboxes waiting on each entry's channel. Started by the first waiter.

    A mailbox gets only the wake-ups committed after its waiter began. NOTIFYs reach the
    listener in the order their transactions committed, and some may still be unread when
    a waiter joins: one of them may carry a value an invalidation has removed since (see
    ``_backends.channels``). So a mailbox that joins a listening connection is confirmed
    by a fence: its store NOTIFYs ``f<fence>`` after the join, and the mailbox is given
    wake-ups from the moment the listener reads that fence. A mailbox that joins while
    nothing listens is confirmed when LISTEN is in place: the connection hears nothing
    older."""

    def __init__(self, conninfo: str, settings: dict[str, Any], timeout: float) -> None:
        self._conninfo = conninfo
        self._settings = {key: value for key, value in settings.items() if key != "options"}
        self._settings["autocommit"] = True
        self.timeout = timeout
        self._lock = threading.Lock()
        self._fence_prefix = f"{secrets.token_hex(6)}."
        self._fences = itertools.count()
        self._reset()
        self._stop = threading.Event()
        reset_after_fork(self)

    def _reset(self) -> None:
        self._waiting = Waiting()  # confirmed mailboxes: they get their channel's wake-ups
        self._unconfirmed: dict[str, Mailbox] = {}  # by fence ("": joined while nothing listened: a key each)
        self._listening = False  # LISTEN is in place. Written under _lock
        self._thread: threading.Thread | None = None

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._reset()  # the parent's thread and connection are not in the child

    def join(self, mailbox: Mailbox) -> str | None:
        """Register ``mailbox``, unconfirmed (starting the listener at the first). The
        fence its store must NOTIFY (``sql.fence``) for the listener to confirm it, or
        None: nothing listens yet, and LISTEN will confirm it. The caller then waits for
        the mailbox's confirmation."""
        with self._lock:
            if self._stop.is_set():
                raise BackendUnavailable("the layer is closed")
            fence = f"{self._fence_prefix}{next(self._fences)}"
            self._unconfirmed[fence] = mailbox
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="stampede-pg-listener", daemon=True)
                self._thread.start()
            return fence if self._listening else None

    def detach(self, mailbox: Mailbox) -> None:
        with self._lock:
            self._waiting.remove(mailbox)
            for fence, unconfirmed in list(self._unconfirmed.items()):
                if unconfirmed is mailbox:
                    del self._unconfirmed[fence]

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        backoff, reconnect = 0.05, False
        while not self._stop.is_set():
            try:
                connection = psycopg.Connection.connect(self._conninfo, **self._settings)
            except psycopg.Error as error:
                wakeups_log.info("stampede: cannot connect to listen for wake-ups (%s)", error)
                self._stop.wait(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            backoff = 0.05
            try:
                connection.execute(f"LISTEN {sql.NOTIFY_CHANNEL}")
                if reconnect:
                    self._wake_all()  # whatever was sent while no connection listened is lost
                reconnect = True
                self._listening_now()
                while not self._stop.is_set():
                    for notice in connection.notifies(timeout=0.2):
                        self._deliver(notice.payload)
            except psycopg.Error as error:
                if not self._stop.is_set():
                    wakeups_log.warning("stampede: lost the connection that listens for wake-ups (%s)", error)
            finally:
                with self._lock:
                    self._listening = False
                connection.close()
                self._wake_all()

    def _listening_now(self) -> None:
        """LISTEN is in place on a new connection: every mailbox waiting for a fence is
        confirmed, the fence's NOTIFY perhaps lost with the old connection. This one
        carries only what committed after it listened."""
        with self._lock:
            self._listening = True
            unconfirmed, self._unconfirmed = list(self._unconfirmed.values()), {}
            for mailbox in unconfirmed:
                self._waiting.add(mailbox)
        for mailbox in unconfirmed:
            mailbox.confirm(True)

    def _deliver(self, payload: str) -> None:
        if payload.startswith(sql.FENCE):
            with self._lock:
                mailbox = self._unconfirmed.pop(payload[len(sql.FENCE) :], None)
                if mailbox is not None:
                    self._waiting.add(mailbox)
            if mailbox is not None:
                mailbox.confirm(True)
            return
        channel, message = sql.wake_up(payload)
        if channel == "*":  # a channel too long for a wake-up of its own
            self._wake_all()
            return
        with self._lock:
            members = self._waiting.on(channel)
        for mailbox in members:
            mailbox.deliver(message)

    def _wake_all(self) -> None:
        with self._lock:
            members = self._waiting.everyone()
        for mailbox in members:
            mailbox.deliver(b"")


class PostgresStore(OneByOne):
    """A Store in a PostgreSQL database, over a psycopg 3 ``ConnectionPool``."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
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
        self._schema_lock = threading.Lock()
        self._sweeper = Sweeper()

    @contextmanager
    def connection(self, what: str, key: str) -> Iterator[psycopg.Connection[Any]]:
        self.breaker.check(key)
        try:
            if not self._schema_ready:
                self._create_schema()
            with self.pool.connection(timeout=self._timeout) as connection:
                yield connection
        except SCHEMA_LOST as error:
            self._schema_ready = False  # the next statement creates it again
            raise failure(self.breaker, what, key, error) from error
        except psycopg.Error as error:
            raise failure(self.breaker, what, key, error) from error
        self.breaker.succeeded()

    def _create_schema(self) -> None:
        """Create the schema unless this version of it is there (see ``SCHEMA_VERSION``)."""
        with self._schema_lock:
            if self._schema_ready:
                return
            with self.pool.connection(timeout=self._timeout) as connection:
                if not schema_ready(connection.execute(sql.SCHEMA_READY).fetchone()):
                    with connection.transaction():
                        connection.execute(sql.SCHEMA_LOCK)
                        if not schema_ready(connection.execute(sql.SCHEMA_READY).fetchone()):
                            connection.execute(sql.SCHEMA)
            self._schema_ready = True

    def _one(self, what: str, key: str, statement: sql.Statement) -> tuple[Any, ...] | None:
        with self.connection(what, key) as connection:
            row: tuple[Any, ...] | None = connection.execute(statement.query, statement.params).fetchone()
        return row

    def _count(self, what: str, key: str, statement: sql.Statement) -> int:
        with self.connection(what, key) as connection:
            return connection.execute(statement.query, statement.params).rowcount

    def get(self, key: str) -> bytes | None:
        row = self._one("read", key, sql.Statement(sql.GET, (key,)))
        return None if row is None else bytes(row[0])

    def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of ``keys`` in one statement (``OneByOne`` sends the rest one by one)."""
        with self.connection("read", keys[0]) as connection:
            rows = connection.execute(sql.GET_MANY, (list(keys),)).fetchall()
        found = {key: bytes(value) for key, value in rows}
        return [found.get(key) for key in keys]

    def get_with_ttl(self, key: str, failing: bool = False) -> tuple[bytes | None, float, bool]:
        row = self._one("read", key, sql.get_with_ttl(key, failing_key(key)))
        if row is None:
            return None, 0.0, False
        return bytes(row[0]), float(row[1]), failing and bool(row[2])

    def acquire(
        self, keys: EntryKeys, token: str, lease_ms: int, check_value: bool, stale: bytes = b""
    ) -> AcquireReply:
        row = self._one("lock", keys.value, sql.acquire(keys, token, lease_ms, check_value, stale))
        return acquire_reply(row)

    def renew(self, keys: EntryKeys, token: str, lease_ms: int) -> bool:
        return self._count("renew the lease of", keys.value, sql.renew(keys, token, lease_ms)) == 1

    def write_release(
        self, keys: EntryKeys, token: str, envelope: bytes, ttl_ms: int, inline: bool, tagged: Tagged | None = None
    ) -> Written:
        with self.connection("write", keys.value) as connection:
            statement = (
                sql.write_release(keys, token, envelope, ttl_ms, inline)
                if tagged is None
                else sql.write_tagged(keys, token, envelope, ttl_ms, inline, tagged)
            )
            row = connection.execute(statement.query, statement.params).fetchone()
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
            row = connection.execute(released.query, released.params).fetchone()
            if not (row and row[0]):
                return Written.REFUSED
            if not connection.execute(kept.query, kept.params).rowcount:
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
        self._one("expire", keys.value, sql.invalidate(keys, keep_stale=True))

    def tag_clock(self, key: str) -> int:
        """The database's one tag clock (a sequence): ``key`` names the namespace's on Redis."""
        row = self._one("read the tag clock", key, sql.Statement(sql.TAG_CLOCK, ()))
        return int(row[0]) if row else 0

    def invalidate_tag(self, clock: str, tag: TagKeys, soft: bool) -> list[str]:
        statement = sql.invalidate_tag(tag, keep_stale=soft)
        with self.connection("invalidate the tag", tag.members) as connection:
            return [key for (key,) in connection.execute(statement.query, statement.params).fetchall()]

    def entry_tags(self, keys: EntryKeys) -> list[str] | None:
        raw = self.get(keys.tags) if self.get(keys.value) is not None else None
        return None if raw is None else raw.decode().split(" ")

    def invalidate(self, keys: EntryKeys) -> None:
        self._one("invalidate", keys.value, sql.invalidate(keys, keep_stale=False))

    def seize(self, keys: EntryKeys, token: str, lease_ms: int) -> None:
        """``invalidate``, then the lease is taken for ``token``, in one transaction: the
        waiters it wakes (at the commit) find the lease taken."""
        dropped, taken = sql.invalidate(keys, keep_stale=False), sql.acquire(keys, token, lease_ms, False, b"")
        with self.connection("invalidate", keys.value) as connection, connection.transaction():
            connection.execute(dropped.query, dropped.params)
            connection.execute(taken.query, taken.params)

    def take_lock(self, keys: EntryKeys, token: str, lease_ms: int, queue_ms: int = 0) -> AcquireReply:
        row = self._one("take the lock", keys.value, sql.take_lock(keys, token, lease_ms, queue_ms))
        return take_lock_reply(row)

    def leave_queue(self, keys: EntryKeys, token: str) -> None:
        self._one("leave the queue of", keys.value, sql.leave_queue(keys, token))

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
            rows = connection.execute(statement.query, statement.params).fetchall()
        return entry_value_keys(row[0] for row in rows)

    def close(self) -> None:
        self.listener.close()
        if self._owns_pool:
            self.pool.close()


def acquire_reply(row: tuple[Any, ...] | None) -> AcquireReply:
    """``stampede_acquire``'s row as the store contract's reply."""
    if row is None:
        raise BackendUnavailable("postgresql returned no row to take a lease")
    state, raw, left_ms, failed, holder = row
    if state == 1:  # left_ms: the value's (schema version 5; 0 from an older one: not told)
        return AcquireReply(LockState.VALUE, bytes(raw), ttl_left=left_ms / 1000 if left_ms > 0 else -1.0)
    if state == 2:
        return AcquireReply(LockState.LOCKED)
    return AcquireReply(LockState.HELD, lease_left=left_ms / 1000, failed=bool(failed), holder=holder or "")


def take_lock_reply(row: tuple[Any, ...] | None) -> AcquireReply:
    """``stampede_take_lock``'s row as the store contract's reply."""
    if row is None:
        raise BackendUnavailable("postgresql returned no row to take a lock")
    state, fence, left_ms = row
    if state == 2:
        return AcquireReply(LockState.LOCKED, fence=int(fence))
    return AcquireReply(LockState.HELD, lease_left=left_ms / 1000)
