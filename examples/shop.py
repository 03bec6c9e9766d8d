"""The examples' database: a shop catalogue in a SQLite file, and a log of every query it serves.

The log is what the examples and the load test count. Every query appends one line to
``<database>.queries`` (when it started and finished, which process ran it, and what it
asked), so the count spans threads, greenlets and processes, and lives outside the cache.
A real database is a network round trip away and busy: each query also waits
``query_seconds``, which is what makes a stampede expensive.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUERY_SECONDS = 0.05

# The cache entries of the two queries. The web app and every load-test process use these
# templates, so they share entries; cache-aside (the baseline) prefixes them with "off:".
CATEGORY_MAP_ENTRY = "category-map:{shop}"
PRODUCT_ENTRY = "product:{product_id}"

SCHEMA = """
CREATE TABLE shops (id INTEGER PRIMARY KEY, slug TEXT NOT NULL UNIQUE, name TEXT NOT NULL);
CREATE TABLE categories (
    id INTEGER PRIMARY KEY,
    shop_id INTEGER NOT NULL REFERENCES shops(id),
    parent_id INTEGER REFERENCES categories(id),
    name TEXT NOT NULL,
    position INTEGER NOT NULL
);
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    shop_id INTEGER NOT NULL REFERENCES shops(id),
    category_id INTEGER NOT NULL REFERENCES categories(id),
    name TEXT NOT NULL,
    price TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 0  -- one more at each update_product
);
"""

TOP_LEVEL = {
    "books": ["novels", "comics", "cookery", "travel"],
    "games": ["board", "video", "puzzles"],
    "garden": ["tools", "seeds", "furniture"],
    "music": ["vinyl", "cds", "instruments"],
}


@dataclass(frozen=True)
class Query:
    """One line of the query log."""

    started: float  # time.time() when the query was sent
    finished: float
    pid: int
    what: str  # the query and its argument, e.g. "category_map shop-3": one cache entry each
    note: str = ""  # what the querying process saw when it began (``ShopDatabase.note``)


class ShopDatabase:
    """A shop catalogue in a SQLite file; every query is logged and costs ``query_seconds``."""

    def __init__(self, path: str | os.PathLike[str], query_seconds: float = QUERY_SECONDS) -> None:
        self.path = Path(path)
        self.log_path = self.path.with_suffix(".queries")
        self.query_seconds = query_seconds
        # Called with a query's ``what`` as it begins; its text goes into the log line (the
        # load test notes what the cache held then, to explain a query it did not expect).
        self.note: Callable[[str], str] | None = None

    @classmethod
    def create(cls, path: str | os.PathLike[str], shops: int = 20, query_seconds: float = QUERY_SECONDS,
               seed: int = 7) -> ShopDatabase:  # fmt: skip
        """A new database of ``shops`` shops (slugs shop-0, shop-1, ...) with an empty query log."""
        database = cls(path, query_seconds)
        for stale in (database.path, database.log_path):
            stale.unlink(missing_ok=True)
        rng = random.Random(seed)
        with contextlib.closing(sqlite3.connect(database.path)) as connection, connection:
            connection.executescript(SCHEMA)
            product_id = 0
            for shop_id in range(shops):
                slug, name = f"shop-{shop_id}", f"Shop {shop_id}"
                connection.execute("INSERT INTO shops VALUES (?, ?, ?)", (shop_id, slug, name))
                for position, (top, children) in enumerate(TOP_LEVEL.items()):
                    parent = connection.execute(
                        "INSERT INTO categories (shop_id, parent_id, name, position) VALUES (?, NULL, ?, ?)",
                        (shop_id, top, position),
                    ).lastrowid
                    for child_position, child in enumerate(children):
                        category = connection.execute(
                            "INSERT INTO categories (shop_id, parent_id, name, position) VALUES (?, ?, ?, ?)",
                            (shop_id, parent, child, child_position),
                        ).lastrowid
                        for _ in range(2):
                            product_id += 1
                            price = f"{rng.randint(100, 9999) / 100:.2f}"
                            connection.execute(
                                "INSERT INTO products VALUES (?, ?, ?, ?, ?, ?, 0)",
                                (product_id, shop_id, category, f"{child} #{product_id}", price,
                                 "2026-11-01T12:00:00+00:00"),
                            )  # fmt: skip
        database.log_path.touch()
        return database

    def category_map(self, shop: str) -> dict[str, list[str]] | None:
        """The shop's two-level category map, ``{top-level: [children, ...]}`` in display
        order; None for a shop that does not exist."""
        with self.query(f"category_map {shop}") as connection:
            rows = connection.execute(
                """
                SELECT shop.id, top.name, child.name
                FROM shops AS shop
                LEFT JOIN categories AS top ON top.shop_id = shop.id AND top.parent_id IS NULL
                LEFT JOIN categories AS child ON child.parent_id = top.id
                WHERE shop.slug = ?
                ORDER BY top.position, child.position
                """,
                (shop,),
            ).fetchall()
        if not rows:
            return None
        categories: dict[str, list[str]] = {}
        for _, top, child in rows:
            if top is not None:
                children = categories.setdefault(top, [])
                if child is not None:
                    children.append(child)
        return categories

    def product(self, product_id: int) -> dict[str, Any] | None:
        """One product as a plain dict, or None if there is no such product."""
        with self.query(f"product {product_id}") as connection:
            row = connection.execute(
                "SELECT id, name, price, updated_at, version FROM products WHERE id = ?", (product_id,)
            ).fetchone()
        if row is None:
            return None
        return {"id": row[0], "name": row[1], "price": row[2], "updated_at": row[3], "version": row[4]}

    def update_product(self, product_id: int) -> int:
        """A new price for the product (the load test's writer); returns its new version.
        A write, not a query: it is not logged."""
        price, now = f"{random.randint(100, 9999) / 100:.2f}", time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
        with contextlib.closing(sqlite3.connect(self.path, timeout=30, isolation_level=None)) as connection:
            connection.execute("BEGIN IMMEDIATE")  # the update and the read of its version, one transaction
            try:
                connection.execute(
                    "UPDATE products SET price = ?, updated_at = ?, version = version + 1 WHERE id = ?",
                    (price, now, product_id),
                )
                row = connection.execute("SELECT version FROM products WHERE id = ?", (product_id,)).fetchone()
            finally:
                connection.execute("COMMIT")
        if row is None:
            raise KeyError(product_id)
        return int(row[0])

    @contextlib.contextmanager
    def query(self, what: str) -> Iterator[sqlite3.Connection]:
        """A connection for one logged query (read-only: the examples only read)."""
        started = time.time()
        note = self.note(what) if self.note is not None else ""
        time.sleep(self.query_seconds)  # the round trip to a busy database server
        connection = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=30)
        try:
            yield connection
        finally:
            connection.close()
            self.record(what, started, note)

    def record(self, what: str, started: float, note: str = "") -> None:
        """Append one query to the log. One write() of one short line to a file opened
        for appending lands whole, whichever process makes it."""
        note = " ".join(note.split())  # one line, no tab
        line = f"{started:.6f} {time.time():.6f} {os.getpid()} {what}\t{note}\n".encode()
        descriptor = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line)
        finally:
            os.close(descriptor)

    def queries(self) -> list[Query]:
        """Every query logged so far, in the order they were logged."""
        if not self.log_path.exists():
            return []
        logged = []
        for line in self.log_path.read_text().splitlines():
            started, finished, pid, rest = line.split(" ", 3)
            what, _, note = rest.partition("\t")
            logged.append(Query(float(started), float(finished), int(pid), what, note))
        return logged

    def count(self, what: str | None = None) -> int:
        """How many queries were logged (of ``what`` only, if given)."""
        return sum(1 for query in self.queries() if what is None or query.what == what)
