"""ORM queries cached by statement and parameters (stampede.sqlalchemy_query), over a real
Redis-compatible server and SQLite files: one query per expiry however many callers, in
threads and in processes; results are the caller's own persistent objects; writes
invalidate the tables' queries after the commit, never before, and a rollback or a
rolled-back savepoint drops what it queued; a session that wrote reads its own rows."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from sqlalchemy import Column, Engine, ForeignKey, Table, create_engine, event, select, update
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    aliased,
    joinedload,
    mapped_column,
    relationship,
    selectinload,
    sessionmaker,
    subqueryload,
)

from stampede import Stampede
from stampede.sqlalchemy_query import QueryCache

from ..query_worker import Base, Category, Product

ROOT = Path(__file__).resolve().parents[2]


def make_database(path: Path) -> Engine:
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 30})

    # SQLAlchemy's recipe for savepoints on pysqlite, which sends no BEGIN of its own (a
    # SAVEPOINT then begins a transaction that its RELEASE commits)
    @event.listens_for(engine, "connect")
    def connected(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def began(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN")

    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all([Product(id=i, name=f"p{i}", category=3 if i <= 3 else 4) for i in range(1, 7)])
        session.add_all([Category(id=3, name="kitchen"), Category(id=4, name="garden")])
        session.commit()
    return engine


class Selects:
    """The SELECTs an engine sent."""

    def __init__(self, engine: Engine) -> None:
        self.sent: list[str] = []
        self._lock = threading.Lock()
        event.listen(engine, "before_cursor_execute", self._sent)

    def _sent(self, connection: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            with self._lock:
                self.sent.append(statement)

    def count(self) -> int:
        return len(self.sent)


@pytest.fixture
def layer(redis_url: str) -> Iterator[Stampede]:
    with Stampede.from_url(redis_url, namespace=f"query-{uuid.uuid4().hex[:8]}", wait_timeout=30) as made:
        yield made


class Shop(NamedTuple):
    engine: Engine
    sessions: sessionmaker[Session]
    queries: QueryCache
    selects: Selects

    def category_3(self) -> Any:
        """The cached query most tests read: category 3's products (p1, p2, p3)."""
        return select(Product).where(Product.category == 3).order_by(Product.id).options(self.queries.cached())


@pytest.fixture
def shop(tmp_path: Path, layer: Stampede) -> Iterator[Shop]:
    engine = make_database(tmp_path / "shop.sqlite")
    sessions = sessionmaker(engine)
    queries = QueryCache(layer, ttl=300)
    queries.install(sessions)
    yield Shop(engine, sessions, queries, Selects(engine))
    engine.dispose()


def names(session: Session, statement: Any) -> list[str]:
    return [product.name for product in session.scalars(statement)]


def test_a_cached_query_is_sent_once_however_many_threads_miss_it_and_each_gets_its_own_objects(shop: Shop) -> None:
    engine = shop.engine
    sessions = shop.sessions
    selects = shop.selects
    statement = shop.category_3()
    slow = threading.Event()
    event.listen(engine, "before_cursor_execute", lambda *args: slow.wait(0.05))
    barrier = threading.Barrier(32)
    got: list[list[str]] = []
    objects: list[tuple[Session, Product]] = []

    def call() -> None:
        with sessions() as session:
            barrier.wait()
            products = list(session.scalars(statement))
            got.append([product.name for product in products])
            assert all(product in session for product in products)  # persistent in this session
            objects.append((session, products[0]))

    threads = [threading.Thread(target=call) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == [["p1", "p2", "p3"]] * 32
    assert selects.count() == 1
    assert len({id(product) for _, product in objects}) == 32  # no object shared between sessions
    with sessions() as session:
        assert names(session, statement) == ["p1", "p2", "p3"] and selects.count() == 1  # a hit


def test_parameters_and_databases_make_entries_of_their_own(shop: Shop, tmp_path: Path, layer: Stampede) -> None:
    sessions = shop.sessions
    queries = shop.queries
    selects = shop.selects
    in_category = lambda category: select(Product).where(Product.category == category).options(queries.cached())  # noqa: E731
    with sessions() as session:
        assert names(session, in_category(3)) == ["p1", "p2", "p3"]
        assert names(session, in_category(4)) == ["p4", "p5", "p6"]
        assert names(session, in_category(3)) == ["p1", "p2", "p3"]
    assert selects.count() == 2
    other = make_database(tmp_path / "other.sqlite")  # the same SQL to another database
    with Session(other) as session:
        session.execute(update(Product).where(Product.id == 1).values(name="other-p1"))
        session.commit()
    other_sessions = sessionmaker(other)
    queries.install(other_sessions)
    with other_sessions() as session:
        assert names(session, in_category(3)) == ["other-p1", "p2", "p3"]
    other.dispose()


def test_a_committed_write_invalidates_the_tables_queries_after_the_commit_and_not_before(shop: Shop) -> None:
    sessions = shop.sessions
    statement = shop.category_3()
    with sessions() as reader:
        assert names(reader, statement) == ["p1", "p2", "p3"]
    with sessions() as writer:
        writer.get(Product, 2).name = "renamed"
        writer.flush()
        assert names(writer, statement) == ["p1", "renamed", "p3"]  # its own rows: not from the cache
        with sessions() as reader:
            assert names(reader, statement) == ["p1", "p2", "p3"]  # not committed: the cached result stands
        writer.commit()
    with sessions() as reader:
        assert names(reader, statement) == ["p1", "renamed", "p3"]
    with sessions() as writer:  # an ORM bulk update through the session
        writer.execute(update(Product).where(Product.id == 3).values(name="bulk"))
        writer.commit()
    with sessions() as reader:
        assert names(reader, statement) == ["p1", "renamed", "bulk"]


def test_a_rollback_and_a_rolled_back_savepoint_leave_the_cache_alone(shop: Shop, layer: Stampede) -> None:
    sessions = shop.sessions
    selects = shop.selects
    statement = shop.category_3()
    with sessions() as reader:
        assert names(reader, statement) == ["p1", "p2", "p3"]
    sent = selects.count()
    with sessions() as writer:
        writer.get(Product, 1).name = "never"
        writer.flush()
        writer.rollback()
        assert names(writer, statement) == ["p1", "p2", "p3"]  # its transaction ended: from the cache again
    assert selects.count() == sent + 1  # the get alone: the query after the rollback came from the cache
    with sessions() as writer:
        with writer.begin_nested() as savepoint:
            writer.get(Product, 1).name = "never"
            writer.flush()
            savepoint.rollback()
        writer.commit()
    with sessions() as reader:
        assert names(reader, statement) == ["p1", "p2", "p3"]
    assert layer.stats()["loads"] == 1  # the tag invalidations queued inside were dropped with them


def test_a_released_savepoint_leaves_its_session_reading_its_own_rows(shop: Shop) -> None:
    """SQLAlchemy ends a savepoint's transaction when it is released, long before the
    commit: the session's rows are still its own, and must not be cached for others."""
    sessions = shop.sessions
    statement = shop.category_3()
    with sessions() as writer:
        with writer.begin_nested():
            writer.get(Product, 2).name = "inner"
        assert names(writer, statement) == ["p1", "inner", "p3"]  # the cache is empty: it would fill it
        writer.rollback()
    with sessions() as reader:
        assert names(reader, statement) == ["p1", "p2", "p3"]


def test_tags_of_its_own_and_a_ttl_of_its_own(shop: Shop, layer: Stampede) -> None:
    sessions = shop.sessions
    queries = shop.queries
    selects = shop.selects
    statement = select(Product).where(Product.id == 1).options(queries.cached(ttl=30, tags=["product:1"]))
    with sessions() as session:
        assert names(session, statement) == ["p1"]
        assert names(session, statement) == ["p1"]
    assert selects.count() == 1
    assert layer.invalidate_tag("product:1") == 1
    with sessions() as session:
        assert names(session, statement) == ["p1"]
    assert selects.count() == 2


def test_64_misses_in_4_processes_send_the_query_once(redis_url: str, tmp_path: Path) -> None:
    make_database(tmp_path / "shop.sqlite").dispose()
    ready = tmp_path / "ready"
    ready.mkdir()
    namespace = f"query-{uuid.uuid4().hex[:8]}"
    command = [
        sys.executable, "-m", "tests.query_worker", "--redis", redis_url, "--database", str(tmp_path / "shop.sqlite"),
        "--namespace", namespace, "--threads", "16", "--ready", str(ready), "--workers", "4",
    ]  # fmt: skip
    workers = [
        subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)
    ]
    results = []
    for worker in workers:
        out, err = worker.communicate(timeout=50)
        assert worker.returncode == 0, err[-3000:]
        assert "Warning" not in err, err[-3000:]
        results.append(json.loads(out))
    assert [got for result in results for got in result["got"]] == [["p1", "p2", "p3"]] * 64
    assert sum(result["selects"] for result in results) == 1


def test_core_writes_through_the_session_invalidate_and_for_update_reads_the_database(shop: Shop) -> None:
    sessions, queries, selects = shop.sessions, shop.queries, shop.selects
    statement = select(Product).where(Product.id == 1).options(queries.cached())
    with sessions() as reader:
        assert names(reader, statement) == ["p1"]
    with sessions() as writer:  # the table, not the mapper: no mapper in the statement
        writer.execute(update(Product.__table__).where(Product.__table__.c.id == 1).values(name="core"))
        writer.commit()
    with sessions() as reader:
        assert names(reader, statement) == ["core"]
        sent = selects.count()
        assert names(reader, statement.with_for_update()) == ["core"]
        assert names(reader, statement.with_for_update()) == ["core"]
        assert selects.count() == sent + 2  # each sent, neither cached


def test_settings_that_load_with_no_caller_are_off_for_queries(redis_url: str, tmp_path: Path) -> None:
    """A layer with a stale window, early refresh and every hit verified: a query's entry
    has no loader outside its caller's execution, so none of them may run one."""
    engine = make_database(tmp_path / "shop.sqlite")
    options = {"stale_while_revalidate": 60.0, "early_refresh": 1.0, "verify_sample": 1.0, "hot_sample": 1.0}
    with Stampede.from_url(redis_url, namespace=f"query-{uuid.uuid4().hex[:8]}", **options) as layer:
        queries = QueryCache(layer, ttl=300)
        sessions = sessionmaker(engine)
        queries.install(sessions)
        statement = select(Product).where(Product.id == 1).options(queries.cached())
        with sessions() as session:
            assert names(session, statement) == ["p1"]
            assert names(session, statement) == ["p1"]  # a hit: verified were it sampled
        with sessions() as writer:
            writer.get(Product, 1).name = "new"
            writer.commit()
        layer.expire_tag("table:products")  # stale: refreshed in the background were it allowed
        with sessions() as session:
            assert names(session, statement) == ["new"]  # loaded by this caller, at once
        stats = layer.stats()
        assert stats["loads"] == 2
        assert all(stats[f"consistency_{result}"] == 0 for result in ("match", "mismatch", "error", "superseded"))
    engine.dispose()


def test_a_write_to_a_table_read_only_in_a_join_or_subquery_invalidates_the_query(shop: Shop) -> None:
    """The statement's mappers name only its top-level entity: the tables it reads
    through a join, a subquery or an alias tag it too."""
    sessions, queries = shop.sessions, shop.queries
    other = aliased(Category)
    statements = [
        select(Product).join(Category, Category.id == Product.category).where(Category.name == "kitchen"),
        select(Product).where(Product.category.in_(select(other.id).where(other.name == "kitchen"))),
    ]
    statements = [statement.order_by(Product.id).options(queries.cached()) for statement in statements]
    with sessions() as reader:
        assert [names(reader, statement) for statement in statements] == [["p1", "p2", "p3"]] * 2
    with sessions() as writer:
        writer.get(Category, 3).name = "scullery"
        writer.commit()
    with sessions() as reader:
        assert [names(reader, statement) for statement in statements] == [[], []]


class _Eager(DeclarativeBase):
    pass


_shelf = Table(
    "shelf_authors", _Eager.metadata,
    Column("shelf_id", ForeignKey("shelves.id"), primary_key=True),
    Column("author_id", ForeignKey("authors.id"), primary_key=True),
)  # fmt: skip


class Shelf(_Eager):
    __tablename__ = "shelves"
    id: Mapped[int] = mapped_column(primary_key=True)
    authors: Mapped[list[Author]] = relationship(secondary=_shelf, order_by="Author.id")


class Author(_Eager):
    __tablename__ = "authors"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    books: Mapped[list[Book]] = relationship(back_populates="author", order_by="Book.id")


class Book(_Eager):
    __tablename__ = "books"
    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str]
    author_id: Mapped[int] = mapped_column(ForeignKey("authors.id"))
    author: Mapped[Author] = relationship(back_populates="books")
    notes: Mapped[list[Note]] = relationship(order_by="Note.id")


class Note(_Eager):
    __tablename__ = "notes"
    id: Mapped[int] = mapped_column(primary_key=True)
    text: Mapped[str]
    book_id: Mapped[int] = mapped_column(ForeignKey("books.id"))


@pytest.mark.parametrize("eager", [joinedload, selectinload, subqueryload])
def test_a_query_is_invalidated_by_a_write_to_any_table_its_eager_loaders_carried(
    eager: Any, tmp_path: Path, layer: Stampede
) -> None:
    """``joinedload`` adds its JOIN when the statement is compiled and ``selectinload``
    runs a statement of its own: neither table shows in the statement, yet the result
    carries their rows (the entry was tagged with the main table alone and served the
    old books after a committed change to them). Every level an eager loader reached
    tags it, a collection loaded empty and an association table too."""
    engine = create_engine(f"sqlite:///{tmp_path / 'books.sqlite'}")
    _Eager.metadata.create_all(engine)
    sessions = sessionmaker(engine)
    queries = QueryCache(layer, ttl=300)
    queries.install(sessions)
    with sessions() as session:
        ada, bob = Author(id=1, name="ada"), Author(id=2, name="bob")
        session.add_all([ada, bob, Shelf(id=1, authors=[ada])])
        session.add(Book(id=1, title="one", author=ada, notes=[Note(id=1, text="n1")]))
        session.commit()
    authors = (
        select(Author).order_by(Author.id).options(queries.cached(), eager(Author.books).options(eager(Book.notes)))
    )
    shelves = select(Shelf).options(queries.cached(), eager(Shelf.authors))

    def read() -> tuple[list[tuple[str, list[tuple[str, list[str]]]]], list[list[str]]]:
        with sessions() as session:
            books = [
                (a.name, [(b.title, [n.text for n in b.notes]) for b in a.books])
                for a in session.scalars(authors).unique()
            ]
            shelved = [[a.name for a in shelf.authors] for shelf in session.scalars(shelves).unique()]
            return books, shelved

    def commit(change: Any) -> None:
        with sessions() as session:
            change(session)
            session.commit()

    assert read() == ([("ada", [("one", ["n1"])]), ("bob", [])], [["ada"]])
    commit(lambda session: setattr(session.get(Book, 1), "title", "one, revised"))
    assert read()[0] == [("ada", [("one, revised", ["n1"])]), ("bob", [])]  # a change to a joined row
    commit(lambda session: session.add(Book(id=2, title="two", author_id=2)))
    assert read()[0] == [("ada", [("one, revised", ["n1"])]), ("bob", [("two", [])])]  # to a collection loaded empty
    commit(lambda session: setattr(session.get(Note, 1), "text", "n1, revised"))
    assert read()[0][0] == ("ada", [("one, revised", ["n1, revised"])])  # two levels down
    commit(lambda session: session.execute(_shelf.insert().values(shelf_id=1, author_id=2)))
    assert read()[1] == [["ada", "bob"]]  # the association table, written through Core
    engine.dispose()
