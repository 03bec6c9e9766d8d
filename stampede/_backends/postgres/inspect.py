"""What the command line reads of a PostgreSQL store: an entry's rows, and the leases in
flight. A process waiting on an entry listens on a channel no other session can count,
and fences come from one sequence for every lock: both are reported as unknown."""

from __future__ import annotations

from ..._core.backend import EntryState, LeaseState
from ..._core.keys import EntryKeys
from ..._core.tags import TagKeys
from . import schema as sql
from .store import PostgresStore


class PostgresInspector:
    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def describe(self, keys: EntryKeys) -> EntryState:
        statement = sql.describe(keys)
        with self._store.connection("inspect", keys.value) as connection:
            row = connection.execute(statement.query, statement.params).fetchone()
        assert row is not None  # a SELECT of subqueries: one row, always
        raw, ttl_ms, holder, lock_ms, failing = row
        return EntryState(
            raw=None if raw is None else bytes(raw),
            ttl_ms=-2 if ttl_ms is None else int(ttl_ms),
            holder=holder,
            lock_ttl_ms=-2 if lock_ms is None else int(lock_ms),
            failing=bool(failing),
            waiting=None,
            tags=self._store.entry_tags(keys) if raw is not None else None,
        )

    def tagged(self, tag: TagKeys) -> int:
        with self._store.connection("count the entries of", tag.members) as connection:
            row = connection.execute(sql.TAGGED, (tag.members,)).fetchone()
        return int(row[0]) if row else 0

    def leases(self, namespace: str) -> list[LeaseState]:
        statement = sql.leases(namespace)
        with self._store.connection("list the leases of", namespace) as connection:
            rows = connection.execute(statement.query, statement.params).fetchall()
        found = []
        for lock_key, token, ttl_ms, queued in rows:
            named = lock_key[len(namespace) + 2 :].startswith("~lock:")
            found.append(LeaseState(lock_key, token, int(ttl_ms), None, int(queued) if named else None))
        return found
