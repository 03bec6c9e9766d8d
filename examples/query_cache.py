"""SQLAlchemy ORM queries cached by their statement (``QueryCache``), with no loader to
write: four worker processes of 16 threads run one cold query at once, and the database
sees it once; a write, once committed, invalidates it, and the next run sends it again.

    python examples/query_cache.py                                   # a throwaway server
    python examples/query_cache.py --redis redis://127.0.0.1:6379/0

The database is a SQLite file in a temporary folder; the statements it is sent are
counted on the Redis server, so the count is the same whichever process sent them.
Exits non-zero unless the cold query was sent once, and again once after the write.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import redis
from bursts import run_workers
from sqlalchemy import Engine, create_engine, event, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from stampede import Stampede
from stampede.sqlalchemy_query import QueryCache
from stampede.testing import server_url

PROCESSES, THREADS = 4, 16


class Base(DeclarativeBase):
    pass


class Product(Base):
    __tablename__ = "products"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    category: Mapped[int]


def open_shop(url: str, database: str, namespace: str) -> tuple[sessionmaker[Any], QueryCache, Engine]:
    """The shop's sessions, their query cache (installed), and its engine, whose SELECTs
    are counted on the server."""
    engine = create_engine(f"sqlite:///{database}")
    counter = redis.Redis.from_url(url, socket_timeout=5)

    @event.listens_for(engine, "before_cursor_execute")
    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            counter.incr(f"{namespace}:selects")

    sessions = sessionmaker(engine)
    queries = QueryCache(Stampede.from_url(url, namespace=namespace), ttl=300)
    queries.install(sessions)
    return sessions, queries, engine


def kettles(queries: QueryCache) -> Any:
    return select(Product).where(Product.category == 3).order_by(Product.id).options(queries.cached())


def worker(url: str, database: str, namespace: str, start: Any) -> None:
    sessions, queries, _ = open_shop(url, database, namespace)
    names: list[list[str]] = []

    def ask() -> None:
        start.wait()
        with sessions() as session:
            names.append([product.name for product in session.scalars(kettles(queries))])

    threads = [threading.Thread(target=ask) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert names == [["kettle", "teapot"]] * THREADS, names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: a throwaway server on 127.0.0.1")
    options = parser.parse_args()
    with server_url(options.redis) as url, tempfile.TemporaryDirectory() as folder:
        namespace = f"orm-{uuid.uuid4().hex[:8]}"
        database = str(Path(folder) / "shop.sqlite")
        sessions, queries, engine = open_shop(url, database, namespace)
        Base.metadata.create_all(engine)
        with sessions() as session:
            session.add_all([Product(id=1, name="kettle", category=3), Product(id=2, name="teapot", category=3)])
            session.commit()
        server = redis.Redis.from_url(url, socket_timeout=5)
        server.delete(f"{namespace}:selects")
        clean = run_workers(worker, PROCESSES, PROCESSES * THREADS, url, database, namespace)
        cold = int(server.get(f"{namespace}:selects") or 0)
        print(f"{PROCESSES} processes x {THREADS} threads ran one cold ORM query: sent to the database {cold} time(s)")
        with sessions() as session:
            session.get(Product, 1).name = "kettle, steel"  # type: ignore[union-attr]
            session.commit()  # invalidates the queries of table products, after the commit
        server.delete(f"{namespace}:selects")
        with sessions() as session:
            after = [product.name for product in session.scalars(kettles(queries))]
            again = [product.name for product in session.scalars(kettles(queries))]
        sent = int(server.get(f"{namespace}:selects") or 0)
        print(f"  after a committed rename: {after} (sent {sent} time(s) for two runs); then {again}")
        if not clean or cold != 1 or sent != 1 or after != ["kettle, steel", "teapot"]:
            sys.exit("expected one query for the cold burst, and one after the write")
        print("OK")


if __name__ == "__main__":
    main()
