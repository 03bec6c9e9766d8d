"""Worker processes for the commit race (tests/frameworks/test_commit.py): a writer that
updates a row in PostgreSQL and commits, and a reader whose cached loader reads it.

``reader``: a cached loader ``row(id)`` over ``--redis``. Prints "ready". On "get" it
calls ``row(1)``; a load prints "loading <value>" (the value it read) and waits for
"release" before it returns. Then prints "got <value>". On "quit" it ends.

``writer --framework django|sqlalchemy --invalidate after-commit|in-transaction``: prints
"ready"; on "begin" it opens a transaction, updates row 1 to ``v2``, invalidates the
entry (with the framework's helper, or at once inside the transaction), prints
"updated" and waits for "commit" or "rollback"; then prints "committed" or "rolled back".
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import psycopg

from stampede import Stampede


def command() -> str:
    return sys.stdin.readline().strip()


def layer_and_loader(redis_url: str, database: Any = None) -> Any:
    layer = Stampede.from_url(redis_url, namespace="commit-race", lock_ttl=10, wait_timeout=30)

    @layer.cached_loader("row:{row_id}")
    def row(row_id: int) -> str:
        value = database.execute("SELECT value FROM race_rows WHERE id = %s", (row_id,)).fetchone()[0]
        print(f"loading {value}", flush=True)
        if command() != "release":
            raise SystemExit(2)
        return str(value)

    return layer, row


def reader(options: argparse.Namespace) -> None:
    database = psycopg.connect(options.postgres, autocommit=True)
    layer, row = layer_and_loader(options.redis, database)
    layer.check()
    print("ready", flush=True)
    while command() == "get":
        print(f"got {row(1)}", flush=True)


def writer(options: argparse.Namespace) -> None:
    _, row = layer_and_loader(options.redis)
    after_commit = options.invalidate == "after-commit"
    if options.framework == "django":
        django_writer(options.postgres, row, after_commit)
    else:
        sqlalchemy_writer(options.postgres, row, after_commit)


def django_writer(url: str, row: Any, after_commit: bool) -> None:
    import django
    from django.conf import settings

    info = psycopg.conninfo.conninfo_to_dict(url)
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": info["dbname"],
                "USER": info.get("user", ""),
                "HOST": info.get("host", ""),
                "PORT": info.get("port", ""),
            }
        }
    )
    django.setup()
    from django.db import connection, transaction

    from stampede.django.commit import invalidate_on_commit

    connection.ensure_connection()
    print("ready", flush=True)
    if command() != "begin":
        return
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("UPDATE race_rows SET value = 'v2' WHERE id = 1")
            if after_commit:
                invalidate_on_commit(row, 1)
            else:
                row.invalidate(1)
            print("updated", flush=True)
            if command() == "rollback":
                raise RolledBack
    except RolledBack:
        print("rolled back", flush=True)
        return
    print("committed", flush=True)


def sqlalchemy_writer(url: str, row: Any, after_commit: bool) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    from stampede.sqlalchemy import invalidate_after_commit

    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with Session(engine) as session:
        session.execute(text("SELECT 1"))
        session.commit()
        print("ready", flush=True)
        if command() != "begin":
            return
        session.execute(text("UPDATE race_rows SET value = 'v2' WHERE id = 1"))
        if after_commit:
            invalidate_after_commit(session, row, 1)
        else:
            row.invalidate(1)
        print("updated", flush=True)
        if command() == "rollback":
            session.rollback()
            print("rolled back", flush=True)
            return
        session.commit()
        print("committed", flush=True)


class RolledBack(Exception):
    pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["reader", "writer"])
    parser.add_argument("--redis", required=True)
    parser.add_argument("--postgres", required=True)
    parser.add_argument("--framework", choices=["django", "sqlalchemy"], default="sqlalchemy")
    parser.add_argument("--invalidate", choices=["after-commit", "in-transaction"], default="after-commit")
    options = parser.parse_args()
    (reader if options.role == "reader" else writer)(options)


if __name__ == "__main__":
    main()
