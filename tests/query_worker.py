"""A worker process of the query cache's collapse test (tests/frameworks/test_query_cache.py):
``--threads`` threads, each with a session of its own, run one cached ORM query over
``--database`` (SQLite) and ``--redis`` at once, after a barrier of every worker (a file
each writes, then waits for all). Prints one line of JSON: the rows each thread got and
the SELECTs this process sent to the database."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from stampede import Stampede
from stampede.sqlalchemy_query import QueryCache


class Base(DeclarativeBase):
    pass


class Category(Base):
    __tablename__ = "categories"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]


class Product(Base):
    __tablename__ = "products"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str]
    category: Mapped[int]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", required=True)
    parser.add_argument("--database", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--ready", required=True, help="a folder: each worker writes a file, then waits for --workers")
    parser.add_argument("--workers", type=int, required=True)
    options = parser.parse_args()

    engine = create_engine(f"sqlite:///{options.database}", connect_args={"timeout": 30})
    selects: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def sent(connection: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            selects.append(statement)
            time.sleep(0.05)  # a slow query: the others arrive while it runs

    layer = Stampede.from_url(options.redis, namespace=options.namespace, wait_timeout=30)
    queries = QueryCache(layer, ttl=300)
    sessions = sessionmaker(engine)
    queries.install(sessions)
    statement = select(Product).where(Product.category == 3).order_by(Product.id).options(queries.cached())

    ready = Path(options.ready)
    (ready / str(threading.get_native_id())).touch()
    deadline = time.monotonic() + 30
    while len(list(ready.iterdir())) < options.workers and time.monotonic() < deadline:
        time.sleep(0.005)
    barrier = threading.Barrier(options.threads)
    got: list[list[str]] = []

    def call() -> None:
        with sessions() as session:
            barrier.wait()
            got.append([product.name for product in session.scalars(statement)])

    threads = [threading.Thread(target=call) for _ in range(options.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    layer.close()
    print(json.dumps({"got": got, "selects": len(selects)}), flush=True)


if __name__ == "__main__":
    main()
