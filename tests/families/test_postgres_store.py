"""The PostgreSQL store against its database's own ways of failing a statement."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from stampede import Stampede
from stampede._core.keys import EntryKeys
from stampede._core.store import LockState, Written


def test_a_write_postgresql_aborts_to_break_a_deadlock_is_run_again(
    make_postgres_layer: Callable[..., Stampede], postgres_url: str
) -> None:
    """The history checker saw a write lost, once in about 100,000 calls under load, to a
    deadlock with a ``set`` (another caller took the lease between its two statements)
    that PostgreSQL broke by aborting the write. Here one is made on purpose: another
    session inserts the entry's row (uncommitted) and then waits for the lease row the
    write has deleted. The write, waiting longer, is the one aborted; it runs again once
    the other session is gone, and writes."""
    store = make_postgres_layer(namespace="deadlock", socket_timeout=10).store()  # statements: 10 s, not 1
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


def _waiting_on_a_lock(connection: psycopg.Connection[Any], function: str) -> bool:
    row = connection.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
        (f"SELECT {function}(%",),
    ).fetchone()
    return bool(row and row[0])
