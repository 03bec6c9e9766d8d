"""Invalidation after the commit (``stampede.django.commit``, ``stampede.sqlalchemy``),
against a real PostgreSQL, with the writer and the reader in two processes.

The race: a writer updates a row; before it commits, a reader misses and loads the row
as it was (the update is not visible yet); the writer commits; the reader's load writes.
Invalidated inside the transaction, the entry is empty when the reader loads, and the old
row is cached after the commit returned: the test sees it (the helper is what it tests).
Invalidated after the commit, the reader's write is refused (the stale-set guard), and
the next read loads the committed row.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from stampede import BackendUnavailable, ConfigError, InvalidKey, Stampede
from stampede.sqlalchemy import invalidate_after_commit, invalidate_on_change, set_after_commit

from ..scenarios import LineWorker

COMMIT_WORKER = str(Path(__file__).parent.parent / "commit_worker.py")
FRAMEWORKS = ["django", "sqlalchemy"]


class Worker(LineWorker):
    def __init__(self, *args: str) -> None:
        super().__init__(COMMIT_WORKER, *args)


@pytest.fixture
def race(redis_url: str, redis_client: object, postgres_url: str) -> Iterator[Callable[..., tuple[Worker, Worker]]]:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute("DROP TABLE IF EXISTS race_rows")
        connection.execute("CREATE TABLE race_rows (id int PRIMARY KEY, value text NOT NULL)")
        connection.execute("INSERT INTO race_rows VALUES (1, 'v1')")
    for key in redis_client.scan_iter("commit-race:*"):  # type: ignore[attr-defined]
        redis_client.delete(key)  # type: ignore[attr-defined]
    started: list[Worker] = []

    def start(framework: str, invalidate: str) -> tuple[Worker, Worker]:
        common = ["--redis", redis_url, "--postgres", postgres_url]
        reader = Worker("reader", *common)
        writer = Worker("writer", *common, "--framework", framework, "--invalidate", invalidate)
        started.extend([reader, writer])
        return reader, writer

    yield start
    for worker in started:
        worker.stop()


def read(reader: Worker) -> str:
    """What ``row(1)`` returns to the reader now, releasing a load if it starts one."""
    line = reader.ask("get")
    if line.startswith("loading"):
        line = reader.ask("release")
    return line.removeprefix("got ")


def race_a_load_against_the_commit(reader: Worker, writer: Worker) -> None:
    assert writer.ask("begin") == "updated"
    assert reader.ask("get") == "loading v1"  # a miss: the update is not committed yet
    assert writer.ask("commit") == "committed"
    assert reader.ask("release") == "got v1"  # its own caller began before the commit


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_after_the_commit_no_reader_gets_the_old_row(
    race: Callable[..., tuple[Worker, Worker]], framework: str
) -> None:
    reader, writer = race(framework, "after-commit")
    race_a_load_against_the_commit(reader, writer)
    assert read(reader) == "v2"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_inside_the_transaction_a_reader_caches_the_old_row(
    race: Callable[..., tuple[Worker, Worker]], framework: str
) -> None:
    """The control: what the helper prevents does happen without it."""
    reader, writer = race(framework, "in-transaction")
    race_a_load_against_the_commit(reader, writer)
    assert read(reader) == "v1"  # stale: served after the commit returned


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_rollback_leaves_the_cache_alone(race: Callable[..., tuple[Worker, Worker]], framework: str) -> None:
    reader, writer = race(framework, "after-commit")
    assert read(reader) == "v1"  # cached
    assert writer.ask("begin") == "updated"
    assert writer.ask("rollback") == "rolled back"
    assert reader.ask("get") == "got v1"  # a hit: nothing was invalidated, nothing loads


class Base(DeclarativeBase):
    pass


class Item(Base):
    __tablename__ = "items"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]


def test_sqlalchemy_mapper_events_invalidate_after_the_commit_only() -> None:
    """``invalidate_on_change``: a flushed update invalidates once the session commits,
    not at the flush, and not at all if it rolls back."""
    engine = create_engine("sqlite://")
    Base.metadata.create_all(engine)
    loads: list[int] = []
    with Stampede(namespace="mapper-events") as layer:

        @layer.cached_loader("item:{item_id}")
        def item(item_id: int) -> str | None:
            loads.append(item_id)
            with Session(engine) as reading:
                found = reading.get(Item, item_id)
                return None if found is None else found.name

        stop = invalidate_on_change(Item, item)
        try:
            with Session(engine) as session:
                session.add(Item(id=1, name="first"))
                session.commit()
                assert item(1) == "first" and loads == [1]
                session.get(Item, 1).name = "second"  # type: ignore[union-attr]
                session.flush()
                assert item(1) == "first" and loads == [1]  # flushed, not committed: still cached
                session.commit()
                assert item(1) == "second" and loads == [1, 1]
                session.get(Item, 1).name = "third"  # type: ignore[union-attr]
                session.flush()
                session.rollback()
                assert item(1) == "second" and loads == [1, 1]
        finally:
            stop()


def test_helpers_refuse_an_async_loader_and_a_bad_key_before_the_commit() -> None:
    with Stampede(namespace="refusals") as layer:

        @layer.cached_loader("a:{x}")
        async def async_loader(x: float) -> int:
            return 1

        @layer.cached_loader("b:{x}")
        def loader(x: float) -> int:
            return 1

        with Session(create_engine("sqlite://")) as session:
            session.execute(text("SELECT 1"))
            with pytest.raises(ConfigError, match="blocking loader"):
                invalidate_after_commit(session, async_loader, 1)
            with pytest.raises(InvalidKey):
                invalidate_after_commit(session, loader, float("nan"))


def test_a_failed_invalidation_raises_into_the_commit() -> None:
    """The rows are committed; a cache left holding the old value must not go unnoticed."""
    layer = Stampede.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2, namespace="down")
    try:

        @layer.cached_loader("row:{x}")
        def loader(x: int) -> int:
            return 1

        with Session(create_engine("sqlite://")) as session:
            session.execute(text("SELECT 1"))
            invalidate_after_commit(session, loader, 1)
            with pytest.raises(BackendUnavailable):
                session.commit()
    finally:
        layer.close()


def test_django_model_signals_invalidate_after_the_commit_only(tmp_path: Path) -> None:
    """``stampede.django.commit.invalidate_on_change``: a save invalidates once its
    transaction commits, not before; a rolled-back save invalidates nothing; a delete
    invalidates."""
    pytest.importorskip("django", reason="Django is not installed (the dev extra installs it)")
    worker = str(Path(__file__).parent.parent / "django_signals_worker.py")
    done = subprocess.run([sys.executable, worker, str(tmp_path / "db.sqlite3")], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "created": ["first", 1],
        "saved, not committed": ["first", 1],  # still the committed row's value
        "committed": ["second", 2],
        "rolled back": ["second", 2],  # nothing invalidated, nothing loaded
        "deleted": [None, 3],
        "connected twice": "refused",
        # One failed invalidation costs neither the next one nor the application's hook.
        "after a failed invalidation": ["changed", ["the application's hook"]],
    }


def _cached_rows(layer: Stampede) -> Any:
    @layer.cached_loader("row:{x}")
    def row(x: int) -> str:
        return f"row {x}"

    for x in (1, 2):
        row(x)
    return row


def test_sqlalchemy_a_released_savepoint_runs_nothing_before_the_outer_commit() -> None:
    """SQLAlchemy sends after_commit when a savepoint is released: the rows are not
    committed then, and a reader that reloads now would cache the old row."""
    with Stampede(namespace="savepoint-released") as layer:
        row = _cached_rows(layer)
        with Session(create_engine("sqlite://")) as session:
            session.execute(text("SELECT 1"))
            savepoint = session.begin_nested()
            invalidate_after_commit(session, row, 1)
            savepoint.commit()
            assert row.peek(1) is not None, "invalidated when the savepoint was released"
            session.commit()
            assert row.peek(1) is None


def test_sqlalchemy_a_rolled_back_savepoint_drops_its_own_actions_only() -> None:
    with Stampede(namespace="savepoint-rolled-back") as layer:
        row = _cached_rows(layer)
        with Session(create_engine("sqlite://")) as session:
            session.execute(text("SELECT 1"))
            invalidate_after_commit(session, row, 1)
            savepoint = session.begin_nested()
            invalidate_after_commit(session, row, 2)
            inner = session.begin_nested()
            set_after_commit(session, row, "rolled back", 2)
            inner.commit()  # its actions pass to the savepoint around it
            savepoint.rollback()
            session.commit()
            assert row.peek(1) is None  # the outer transaction's action ran
            found = row.peek(2)
            assert found is not None and found.value == "row 2"  # the savepoint's did not


def test_sqlalchemy_a_session_closed_without_commit_forgets_its_actions() -> None:
    with Stampede(namespace="session-closed") as layer:
        row = _cached_rows(layer)
        with Session(create_engine("sqlite://")) as session:
            session.execute(text("SELECT 1"))
            set_after_commit(session, row, "never committed", 1)
            session.close()
            session.execute(text("SELECT 1"))
            session.commit()
            found = row.peek(1)
            assert found is not None and found.value == "row 1"
