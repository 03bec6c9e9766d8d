"""The PostgreSQL store against its database's own ways of failing a statement."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from stampede import Stampede
from stampede._core.keys import EntryKeys
from stampede._core.store import LockState, Written

pytestmark = pytest.mark.extended  # the PostgreSQL family: CI's extended step (tests/conftest.py)


def test_a_write_postgresql_aborts_to_break_a_deadlock_is_run_again(
    make_postgres_layer: Callable[..., Stampede], postgres_url: str
) -> None:
    """The history checker saw a write lost, once in about 100,000 calls under load, to a
    deadlock with a ``set`` (another caller took the lease between its two statements)
    that PostgreSQL broke by aborting the write. Here one is made on purpose: another
    session inserts the entry's row (uncommitted) and then waits for the lease row the
    write has deleted. The write, waiting longer, is the one aborted; it runs again once
    the other session is gone, and writes.

    PostgreSQL looks for a deadlock once a wait, ``deadlock_timeout`` after it began: the
    write's sessions look after 4 s, so the other session is surely waiting by then (with
    the default 1 s, a loaded machine once let the write's one look pass before the other
    session waited, and nobody was aborted until the write's statement timed out)."""
    patient = f"{postgres_url}?options=-c%20deadlock_timeout%3D4s"
    store = make_postgres_layer(patient, namespace="deadlock", socket_timeout=10).store()  # statements: 10 s, not 1
    keys = EntryKeys.for_value("deadlock:{item:1}")
    assert store.acquire(keys, "holder", 10_000, False).state is LockState.LOCKED
    other = psycopg.connect(postgres_url, autocommit=True)
    watcher = psycopg.connect(postgres_url, autocommit=True)  # pg_stat_activity read anew (not in a transaction)
    written: list[Any] = []
    try:
        other.execute("SET deadlock_timeout = '30s'")  # this session never detects it: the write does
        other.execute("BEGIN")
        other.execute(
            "INSERT INTO stampede_values (key, value, expires_at) VALUES (%s, 'x', now() + interval '1 minute')",
            (keys.value,),
        )
        writer = threading.Thread(
            target=lambda: written.append(store.write_release(keys, "holder", b"v", 60_000, False))
        )
        writer.start()
        deadline = time.monotonic() + 10
        while not _waiting_on_a_lock(watcher, "stampede_write_release"):
            assert time.monotonic() < deadline, "the write never waited for the other session"
            time.sleep(0.01)
        other.execute("SELECT 1 FROM stampede_leases WHERE key = %s FOR UPDATE", (keys.lock,))  # waits: a deadlock
        other.execute("ROLLBACK")
        writer.join(10)
        assert not writer.is_alive()
    finally:
        other.close()
        watcher.close()
    assert written == [Written.YES]
    assert store.get(keys.value) == b"v"
    assert store.holder(keys) is None


def test_a_set_holds_the_lease_before_it_touches_the_value_so_no_caller_takes_it_between(
    make_postgres_layer: Callable[..., Stampede], postgres_url: str
) -> None:
    """The history checker's deadlock, at its root: a ``set``'s seize ran two statements
    (invalidate, then take the lease), and a caller could take the lease between them,
    then wait on the value row the seize had deleted while the seize waited on its lease.
    Now the seize is one function that takes the lease row first. Here the value row is
    held by another session, so the seize stops there: the lease must be held already
    (a caller trying to take it waits, and gives up at its lock timeout)."""
    store = make_postgres_layer(namespace="seize", socket_timeout=10).store()
    keys = EntryKeys.for_value("seize:{item:1}")
    assert store.acquire(keys, "loader", 10_000, False).state is LockState.LOCKED
    assert store.write_release(keys, "loader", b"old", 60_000, False) is Written.YES  # a value, and no lease
    other = psycopg.connect(postgres_url, autocommit=True)
    watcher = psycopg.connect(postgres_url, autocommit=True)
    taker = psycopg.connect(postgres_url, autocommit=True)
    seized: list[BaseException | None] = []

    def seize() -> None:
        try:
            store.seize(keys, "setter", 60_000)
            seized.append(None)
        except BaseException as error:
            seized.append(error)

    try:
        other.execute("BEGIN")
        other.execute("SELECT 1 FROM stampede_values WHERE key = %s FOR UPDATE", (keys.value,))
        setter = threading.Thread(target=seize)
        setter.start()
        deadline = time.monotonic() + 10
        while not _waiting_on_a_lock(watcher, "stampede_seize"):
            assert time.monotonic() < deadline, f"the seize never waited for the value row: {seized}"
            time.sleep(0.01)
        taker.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):  # the lease is the setter's, uncommitted
            taker.execute("SELECT stampede_take_lease(%s, 'loader', 10000, clock_timestamp())", (keys.lock,))
        other.execute("COMMIT")
        setter.join(10)
        assert not setter.is_alive() and seized == [None]
    finally:
        other.close()
        watcher.close()
        taker.close()
    assert store.holder(keys) == "setter"
    assert store.get(keys.value) is None


def _waiting_on_a_lock(connection: psycopg.Connection[Any], function: str) -> bool:
    row = connection.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
        (f"SELECT {function}(%",),
    ).fetchone()
    return bool(row and row[0])


def test_the_urls_own_session_options_are_kept_beside_the_statement_timeout(
    make_postgres_layer: Callable[..., Stampede], postgres_url: str
) -> None:
    """A ``postgresql://`` URL's ``options`` (a ``search_path``, a ``work_mem``) reach
    every connection of the layer's pool, blocking and asyncio, with the statement timeout
    the layer adds: it once replaced them."""
    layer = make_postgres_layer(f"{postgres_url}?options=-c%20work_mem%3D7MB", socket_timeout=3)
    store: Any = layer.store()
    with store.pool.connection() as connection:
        shown = [connection.execute(f"SHOW {name}").fetchone()[0] for name in ("work_mem", "statement_timeout")]
    assert shown == ["7MB", "3s"]

    async def shown_by_a_loop() -> list[str]:
        loop_store: Any = layer.loop_store()
        async with loop_store.pool.connection() as connection:
            return [
                (await (await connection.execute(f"SHOW {name}")).fetchone())[0]
                for name in ("work_mem", "statement_timeout")
            ]

    assert asyncio.run(shown_by_a_loop()) == ["7MB", "3s"]


def test_a_tagged_lease_reads_the_tag_clock_in_its_own_statement(
    make_postgres_layer: Callable[..., Stampede],
) -> None:
    """A tagged load's lease reads the tag clock in the statement that takes it (one
    round trip, not two); a lease found held reads none."""
    store = make_postgres_layer(namespace="tagged-lease").store()
    keys = EntryKeys.for_value("tagged-lease:{item:1}")
    clock = store.tag_clock("tagged-lease:tag-clock")
    taken = store.acquire(keys, "loader", 10_000, True, clock="tagged-lease:tag-clock")
    assert taken.state is LockState.LOCKED and taken.since == clock
    held = store.acquire(keys, "another", 10_000, True, clock="tagged-lease:tag-clock")
    assert held.state is LockState.HELD and held.since is None
    assert store.release(keys, "loader")
