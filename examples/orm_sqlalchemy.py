"""A drop-in around a SQLAlchemy ORM query: cache the row, not the ORM object.

    python examples/orm_sqlalchemy.py                              # embedded backend, SQLite file
    python examples/orm_sqlalchemy.py --redis redis://127.0.0.1:6379/0

How to cache what an ORM returns, safely:

* Cache a plain, immutable copy of the row (a frozen dataclass), never the mapped object.
  A mapped object belongs to the session that loaded it: after the session closes its
  lazy relationships raise, and an unpickled one is attached to nothing. Pickling it
  would also let whoever can write to the cache run code in your process.
* Give the loader a serializer for that type, so a value read from the cache is the same
  type as the value just loaded. With the default JSON serializer a hit would return a
  dict (and Decimal would not serialize at all).
* Return None for a missing row: the null sentinel is cached for ``null_ttl``, so a
  stream of requests for an id that does not exist does not reach the database.
* After a write, commit first, then ``invalidate()``: the next read loads the new row,
  and a load that was already running cannot write the old one back.
* A page of products is one ``cached_loader_many`` over the same entries: its hits are
  one round trip, its misses one ``SELECT ... WHERE id IN (...)``, and an id another
  caller is loading (a page or a single product) is waited for, not selected again.

The query count comes from the database's own log (SQLAlchemy's cursor events): one
SELECT for 50 threads on a cold product, one for a missing id, one after an update, one
for 50 threads on a cold page of products (the product already cached not among its
ids), none for the page again. It exits non-zero if any of that does not hold.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
from category_map import burst
from shop import ShopDatabase
from sqlalchemy import String, create_engine, event, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from stampede import CachedLoader, CachedManyLoader, Stampede


class Base(DeclarativeBase):
    pass


class Product(Base):
    """The products table of examples/shop.py, mapped."""

    __tablename__ = "products"
    id: Mapped[int] = mapped_column(primary_key=True)
    shop_id: Mapped[int]
    category_id: Mapped[int]
    name: Mapped[str]
    price: Mapped[str] = mapped_column(String)  # exact decimal, as text (SQLite has no DECIMAL)
    updated_at: Mapped[str]


@dataclass(frozen=True)
class ProductRow:
    """What is cached: a detached, immutable copy of a product row."""

    id: int
    name: str
    price: Decimal
    updated_at: dt.datetime

    @classmethod
    def of(cls, product: Product) -> ProductRow:
        return cls(product.id, product.name, Decimal(product.price), dt.datetime.fromisoformat(product.updated_at))


class ProductRowSerializer:
    """JSON (orjson) for ProductRow, read back as a ProductRow; never pickle."""

    def dumps(self, row: ProductRow) -> bytes:
        return orjson.dumps(asdict(row), default=str)  # Decimal as its exact text

    def loads(self, data: bytes) -> ProductRow:
        fields = orjson.loads(data)
        return ProductRow(fields["id"], fields["name"], Decimal(fields["price"]),
                          dt.datetime.fromisoformat(fields["updated_at"]))  # fmt: skip


def logged_engine(database: ShopDatabase) -> Engine:
    """An engine on the shop's SQLite file whose every statement goes to the query log,
    after the same simulated round trip as the other examples' queries."""
    engine = create_engine(f"sqlite:///{database.path}")

    @event.listens_for(engine, "before_cursor_execute")
    def before(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        conn.info["query_started"] = time.time()
        time.sleep(database.query_seconds)

    @event.listens_for(engine, "after_cursor_execute")
    def after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        verb = statement.split(None, 1)[0].upper()
        database.record(f"orm {verb} products {parameters}", conn.info.pop("query_started"))

    return engine


def make_product_loader(layer: Stampede, engine: Engine, ttl: float = 60) -> CachedLoader[[int], Any]:
    @layer.cached_loader("product:{product_id}", ttl=ttl, null_ttl=10, serializer=ProductRowSerializer())
    def product(product_id: int) -> ProductRow | None:
        with Session(engine) as session:
            found = session.get(Product, product_id)
            return None if found is None else ProductRow.of(found)

    return product


def make_page_loader(layer: Stampede, engine: Engine, ttl: float = 60) -> CachedManyLoader[int, ProductRow | None]:
    """A product list page: the same entries as ``make_product_loader``'s, many at once."""

    @layer.cached_loader_many("product:{product_id}", ttl=ttl, null_ttl=10, serializer=ProductRowSerializer())
    def products(product_ids: list[int]) -> dict[int, ProductRow]:
        with Session(engine) as session:
            rows = session.scalars(select(Product).where(Product.id.in_(product_ids)))
            return {row.id: ProductRow.of(row) for row in rows}  # an id not found is cached as None

    return products


def shown(value: Any) -> str:
    """A value as the steps print it: a page as its size and its product 7."""
    if isinstance(value, dict):
        return f"{len(value)} products, #7 at {value[7].price}"
    return repr(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", help="a Redis URL; default: the embedded backend (this process only)")
    parser.add_argument("--threads", type=int, default=50)
    options = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        database = ShopDatabase.create(Path(folder) / "shop.sqlite")
        engine = logged_engine(database)
        url, namespace = options.redis, "example"
        layer = Stampede.from_url(url, namespace=namespace) if url else Stampede(namespace=namespace)
        product = make_product_loader(layer, engine)
        page = make_page_loader(layer, engine)
        if options.redis:
            page.invalidate([*range(1, 21), 999_999])  # a fresh start on a server that outlives us
        print(f"cache: {options.redis or 'embedded'}; database: SQLAlchemy ORM on SQLite")
        ok = True

        def step(title: str, asked: Any, expected_queries: int) -> list[Any]:
            nonlocal ok
            before = database.count()
            results = burst(page if isinstance(asked, list) else product, asked, options.threads)  # type: ignore[arg-type]
            queries = database.count() - before
            same = len({repr(result) for result in results}) == 1
            print(f"{title:<38} {options.threads} threads: {queries} SELECT{'' if queries == 1 else 's'}, "
                  f"{'one value' if same else 'DIFFERENT VALUES'}: {shown(results[0])}")  # fmt: skip
            ok = ok and same and queries == expected_queries
            return results

        loaded = step("a cold product", 7, 1)[0]
        cached = step("the same product, from the cache", 7, 0)[0]
        ok = ok and isinstance(cached, ProductRow) and cached == loaded
        ok = ok and step("a product that does not exist", 999_999, 1)[0] is None
        step("again: the null sentinel answers", 999_999, 0)
        page_ids = list(range(1, 21))
        listed = step("a page of 20 products, one cached", page_ids, 1)[0]  # type: ignore[arg-type]
        ok = ok and list(listed) == page_ids and listed[7] == loaded and isinstance(listed[3], ProductRow)
        step("the same page, from the cache", page_ids, 0)  # type: ignore[arg-type]

        with Session(engine) as session, session.begin():
            row = session.get(Product, 7)
            assert row is not None
            row.price = str(Decimal(row.price) + Decimal("1.00"))
        product.invalidate(7)  # after the commit
        updated = step("after an update and invalidate()", 7, 1)[0]
        ok = ok and updated.price == loaded.price + Decimal("1.00")
        ok = ok and step("the page: the same entry, updated", page_ids, 0)[0][7] == updated  # type: ignore[arg-type]
        print("cache counters:", layer.stats())
        layer.close()
        engine.dispose()
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
