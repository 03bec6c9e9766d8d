"""ORM queries cached by their statement and parameters, one load per query per expiry
across processes, invalidated after the commit of any write to a table they read.

SQLAlchemy's ``do_orm_execute`` event lets a listener answer a query itself (its docs'
"re-executing statements" example, dogpile.cache's ``caching_query``). ``QueryCache``
answers the queries that ask for it::

    queries = QueryCache(layer, ttl=60)
    queries.install(Session)            # a Session class, a sessionmaker, or one session

    stmt = select(Product).where(Product.category_id == 3).options(queries.cached(tags=["category:3"]))
    session.scalars(stmt).all()         # one query per expiry, however many callers

* **The key** is a digest of the statement's SQL, its parameters and the database it goes
  to (the bind's URL, its password left out): two queries share an entry only if they
  are the same query to the same URL. Two databases behind one URL (an in-memory SQLite
  in each process) share entries: give each a ``name`` of its own.
* **The value** is the query's ``FrozenResult``, pickled, merged into the caller's
  session without loading (``merge_frozen_result(..., load=False)``): the caller gets
  persistent objects of its own session. Pickled as the Django backend pickles: whoever
  can write to the cache server can run code in every process that reads it, so the
  server must be trusted as the database is.
* **Invalidation waits for the commit.** A cached query is tagged ``table:<name>`` for
  each table it reads: its entities' and every one joined, in a subquery or aliased,
  and every table whose rows its result carries through an eager loader
  (``joinedload``, ``selectinload``, ``subqueryload``: the related mappers' and the
  association tables', at every level loaded).
  Every flushed insert, update and delete of an instance, and every ``update()``,
  ``delete()`` and ``insert()`` run through the session (of a mapped class or a table),
  queues the invalidation of its tables' tags for after the commit (``stampede.sqlalchemy``'s
  queue: savepoints rolled back drop theirs). Once that commit's invalidation returns,
  no caller gets a result read before it, and a load in flight does not write.
* **A session that wrote is not served from the cache**, nor does it fill it: until its
  transaction ends, its queries run against the database (they would see its own
  uncommitted rows, which must reach no other caller, and which a rollback undoes).
  Nor is a ``FOR UPDATE`` query: its row locks are the point.
* **Only a caller loads.** Settings that would load with no caller (background refresh,
  retries, verification, warm starts: ``NO_CALLER``) are off for queries.

Not seen: Core statements on a ``Connection`` outside the session, and writes by other
programs. Give those paths ``invalidate_tag_after_commit(session, layer, "table:name")``
or a ``ttl`` that bounds how stale a result may be.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, event, inspect
from sqlalchemy.engine import FrozenResult
from sqlalchemy.orm import InstanceState, ORMExecuteState, Session, UserDefinedOption
from sqlalchemy.orm.loading import merge_frozen_result
from sqlalchemy.sql.util import find_tables

from ._core.pickle_serializer import PickleSerializer
from ._core.results import Cached
from ._layer import Stampede
from .sqlalchemy import invalidate_tag_after_commit

_WROTE = "stampede.query_cache.wrote"  # session.info: this transaction flushed or ran a write
TABLE_TAG = "table:{table}"
NO_CALLER: dict[str, Any] = {
    "stale_while_revalidate": 0.0,
    "stale_if_error": 0.0,
    "early_refresh": 0.0,
    "verify_sample": 0.0,
    "hot_sample": 0.0,
}
"""The settings that load with no caller (a background refresh or retry, a verification,
a warm start) are off, whatever the layer says: a query's entry is loaded only by its
caller's own execution, which is the one thing that can run it."""


class _Cached(UserDefinedOption):
    """The option ``QueryCache.cached()`` gives a statement."""

    inherit_cache = True

    def __init__(self, cache: QueryCache, ttl: float | None, tags: Sequence[str]) -> None:
        super().__init__()
        self.cache, self.ttl, self.tags = cache, ttl, tuple(tags)

    def _gen_cache_key(self, anon_map: Any, bindparams: Any) -> tuple[Any, ...]:
        return (type(self), id(self.cache), self.ttl, self.tags)


@dataclass
class _Pending:
    """The query whose result the loader is asked for (the leader's own execution)."""

    state: ORMExecuteState
    option: _Cached


_pending: contextvars.ContextVar[_Pending] = contextvars.ContextVar("stampede_query_pending")


class QueryCache:
    """Cached ORM queries over ``layer``: ``install`` it on sessions, then mark a query
    with ``.options(query_cache.cached())``. ``ttl`` is its entries' default life."""

    def __init__(self, layer: Stampede, *, ttl: float | None = None, name: str = "query") -> None:
        self.layer = layer
        self._load = layer.cached_loader(
            f"{name}:{{digest}}",
            tags=[],  # each entry's: its tables' and the query's own (Cached)
            serializer=PickleSerializer(),
            ttl=layer.settings.ttl if ttl is None else ttl,
            **NO_CALLER,
        )(_load_pending)

    def cached(self, *, ttl: float | None = None, tags: Iterable[str] = ()) -> _Cached:
        """The option that caches a query: ``ttl`` for this query's entry, and ``tags`` of
        its own beside its tables' (invalidate them with ``layer.invalidate_tag``)."""
        return _Cached(self, ttl, list(tags))

    def install(self, target: Any = Session) -> None:
        """Answer the cached queries of ``target`` (a Session class, a sessionmaker or a
        session) and queue the invalidation of what it writes. Once per target."""
        event.listen(target, "do_orm_execute", self._on_execute)
        event.listen(target, "after_flush", self._on_flush)
        event.listen(target, "after_transaction_end", _transaction_ended)

    def _on_flush(self, session: Session, flush_context: Any) -> None:
        """What the flush wrote (the session's lists still hold it here)."""
        changed = [*session.new, *session.dirty, *session.deleted]
        if changed:
            self._wrote(session, _tables_of({inspect(instance).mapper for instance in changed}))

    def _wrote(self, session: Session, tables: Iterable[str]) -> None:
        session.info[_WROTE] = True
        for table in tables:
            invalidate_tag_after_commit(session, self.layer, TABLE_TAG.format(table=table))

    def _on_execute(self, state: ORMExecuteState) -> Any:
        if state.is_insert or state.is_update or state.is_delete:
            table: Any = getattr(state.statement, "table", None)  # a Core statement's, through the session
            written = {*_tables_of(state.all_mappers), *([table.name] if hasattr(table, "name") else [])}
            self._wrote(state.session, sorted(written))
            return None
        option = next((found for found in state.user_defined_options if isinstance(found, _Cached)), None)
        if option is None or option.cache is not self or not state.is_select or state.is_relationship_load:
            return None
        if state.session.info.get(_WROTE):
            return None  # its own uncommitted rows: for it alone
        if getattr(state.statement, "_for_update_arg", None) is not None:
            return None  # FOR UPDATE: the row locks are the point, and only the database takes them
        token = _pending.set(_Pending(state, option))
        try:
            frozen = self._load(_digest(state))
        finally:
            _pending.reset(token)
        merged = merge_frozen_result(state.session, state.statement, frozen, load=False)  # type: ignore[no-untyped-call]
        return merged()


def _load_pending(digest: str) -> Any:
    """The loader of every entry: the query of the caller that leads the load."""
    pending = _pending.get()
    frozen: FrozenResult[Any] = pending.state.invoke_statement().freeze()
    tables = {*_tables_of(pending.state.all_mappers), *_tables_in(pending.state.statement), *_tables_carried(frozen)}
    tags = [TABLE_TAG.format(table=table) for table in sorted(tables)]
    return Cached(frozen, ttl=pending.option.ttl, tags=[*tags, *pending.option.tags])


def _digest(state: ORMExecuteState) -> str:
    """The query's identity: its SQL and parameters (SQLAlchemy's own cache key), and the
    database it is sent to."""
    statement: Any = state.statement
    key = statement._generate_cache_key()  # SQLAlchemy's documented recipe
    if key is None:
        raise TypeError(f"this statement cannot be cached: SQLAlchemy gives it no cache key ({statement})")
    parameters = dict(state.parameters) if isinstance(state.parameters, Mapping) else {}
    text = key.to_offline_string({}, statement, parameters)
    bind = state.session.get_bind(**state.bind_arguments)
    database = bind.engine.url.render_as_string(hide_password=True)
    return hashlib.sha256(f"{database}\n{text}".encode()).hexdigest()[:40]


def _tables_in(statement: Any) -> set[str]:
    """Every table the statement reads: joined, in a subquery, behind an alias (the
    statement's mappers name only its top-level entities)."""
    found = find_tables(statement, include_joins=True, check_columns=True)
    return {table.name for table in found if isinstance(table, Table)}


def _tables_carried(frozen: FrozenResult[Any]) -> set[str]:
    """Every table whose rows the result carries: its instances' and, through every
    relationship an eager loader filled (``joinedload`` adds its JOIN when the statement
    is compiled, ``selectinload`` and ``subqueryload`` run statements of their own:
    neither shows in the statement), the related mapper's and the association table's,
    loaded empty or not, down to the last level loaded. A relationship left unloaded
    (lazy) is read afresh from the database when touched, so it carries nothing."""
    tables: set[str] = set()
    seen: set[int] = set()
    found = [item for row in frozen.data for item in (row if isinstance(row, tuple) else (row,))]
    while found:
        state = inspect(found.pop(), raiseerr=False)
        if not isinstance(state, InstanceState) or id(state) in seen:
            continue
        seen.add(id(state))
        tables.update(table.name for table in state.mapper.tables)
        for relationship in state.mapper.relationships:
            if relationship.key not in state.dict:
                continue
            tables.update(table.name for table in relationship.mapper.tables)
            if isinstance(relationship.secondary, Table):
                tables.add(relationship.secondary.name)
            loaded = state.dict[relationship.key]
            if loaded is None:
                continue
            if not relationship.uselist:
                found.append(loaded)
            else:
                found.extend(loaded.values() if isinstance(loaded, Mapping) else loaded)
    return tables


def _tables_of(mappers: Iterable[Any]) -> list[str]:
    return sorted({table.name for mapper in mappers for table in mapper.tables})


def _transaction_ended(session: Session, transaction: Any) -> None:
    """The outermost transaction ended (committed or not): the session's writes are
    everyone's now, or gone. A savepoint's end changes nothing."""
    if transaction.parent is None:
        session.info.pop(_WROTE, None)
