"""A generated workload for ``History.check``: threads calling a cache over a few keys
that collide, while writers update the database and invalidate, set and expire.

``Rows`` is the database: one versioned row per key, each write a new version. The
cache under test is driven through a ``Subject``: how it reads a key, reads many, and
what the application does on a write (``update``: the database write and the cache's
invalidation, in the order the application does them). ``layer_subject`` makes one of a
stampede layer; a test can make one of anything else (a deliberately broken cache, to
see the checker catch it).

    rows = Rows(recorder)
    subject = layer_subject(layer, rows)
    run_workload(subject, recorder, threads=8, operations=20_000, seed=1)
    report = History.of(recorder).check(wait_bound=5.0)
    assert report.ok, report
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .history import Recorder

Row = dict[str, Any]  # {"key": key, "version": n}


class Rows:
    """Versioned rows, thread-safe. ``load`` and ``load_many`` are loaders: each run is
    recorded as a "load" of the versions it read, after ``delay`` seconds of "query"."""

    def __init__(self, recorder: Recorder, delay: float = 0.0) -> None:
        self.recorder = recorder
        self.delay = delay
        self._versions: dict[Any, int] = {}
        self._lock = threading.Lock()

    def write(self, key: Any) -> int:
        """A new version of the row, recorded; returns it."""
        with self._lock:
            version = self._versions.get(key, 0) + 1
            with self.recorder.op("write", key, version=version):
                self._versions[key] = version
        return version

    def load(self, key: Any) -> Row:
        with self.recorder.op("load", key) as op:
            if self.delay:
                time.sleep(self.delay)
            with self._lock:
                version = self._versions.get(key, 0)
            op.saw(version)
        return {"key": key, "version": version}

    def load_many(self, keys: Sequence[Any]) -> dict[Any, Row]:
        with self.recorder.op("load", *keys) as op:
            if self.delay:
                time.sleep(self.delay)
            with self._lock:
                found = {key: {"key": key, "version": self._versions.get(key, 0)} for key in keys}
            for key, row in found.items():
                op.saw(row["version"], key=key)
        return found


@dataclass
class Subject:
    """The cache under test. ``update(key)`` is the application's write path: it writes
    the row (``Rows.write``) and makes the cache forget the old one, and returns the
    version written. ``read_many``, ``expire`` and ``set`` are optional."""

    read: Callable[[Any], Row | None]
    update: Callable[[Any], int]
    read_many: Callable[[list[Any]], Mapping[Any, Row | None]] | None = None
    expire: Callable[[Any], None] | None = None
    set: Callable[[Any], int] | None = None


def layer_subject(layer: Any, rows: Rows, template: str = "row:{key}", **settings: Any) -> Subject:
    """A ``Subject`` of a stampede layer: a cached loader and a many-key loader over the
    same entries, invalidated after each write; ``set`` writes the row and then the
    entry; ``expire`` expires it."""
    one = layer.cached_loader(template, **settings)(rows.load)
    many = layer.cached_loader_many(template, **settings)(rows.load_many)

    def update(key: Any) -> int:
        version = rows.write(key)
        one.invalidate(key)
        return version

    def set_(key: Any) -> int:
        version = rows.write(key)
        one.set({"key": key, "version": version}, key)
        return version

    return Subject(read=one, update=update, read_many=many, expire=one.expire, set=set_)


@dataclass(frozen=True)
class Mix:
    """How often each operation is drawn (weights)."""

    read: float = 80
    read_many: float = 8
    update: float = 8
    set: float = 2
    expire: float = 2


def run_workload(
    subject: Subject,
    recorder: Recorder,
    *,
    keys: int = 6,
    threads: int = 8,
    operations: int = 10_000,
    seconds: float | None = None,
    seed: int = 0,
    mix: Mix = Mix(),
) -> int:
    """Run ``operations`` drawn from ``mix`` over ``keys`` keys in ``threads`` threads
    (or until ``seconds`` pass), each recorded; returns how many ran. An operation that
    raises is recorded with its exception's name and the run goes on."""
    weights = {name: getattr(mix, name) for name in ("read", "read_many", "update", "set", "expire")}
    if subject.read_many is None:
        weights["read_many"] = 0
    if subject.set is None:
        weights["set"] = 0
    if subject.expire is None:
        weights["expire"] = 0
    names, cumulative = list(weights), list(weights.values())
    left = [operations]
    lock = threading.Lock()
    # A row's writes do not race each other (a database serializes them): a write and its
    # invalidation, or set, run under the key's lock. Two writers setting one entry could
    # leave the older value last, which no cache can know.
    writing = [threading.Lock() for _ in range(keys)]
    deadline = None if seconds is None else time.monotonic() + seconds
    errors: list[BaseException] = []

    def one(draw: random.Random) -> None:
        name = draw.choices(names, cumulative)[0]
        key = draw.randrange(keys)
        if name == "read":
            with recorder.op("read", key) as op:
                row = subject.read(key)
                if row is not None:
                    op.saw(row["version"], source=row["key"])
        elif name == "read_many":
            asked = draw.sample(range(keys), min(keys, draw.randint(2, 4)))
            assert subject.read_many is not None
            with recorder.op("read", *asked) as op:
                found = subject.read_many(asked)
                for asked_key, row in found.items():
                    if row is not None:
                        op.saw(row["version"], key=asked_key, source=row["key"])
        elif name == "update":
            with writing[key], recorder.op("invalidate", key) as op:
                op.saw(subject.update(key))
        elif name == "set":
            assert subject.set is not None
            with writing[key], recorder.op("set", key) as op:
                op.saw(subject.set(key))
        else:
            assert subject.expire is not None
            with writing[key], recorder.op("expire", key):
                subject.expire(key)

    def worker(number: int) -> None:
        draw = random.Random(seed * 1000 + number)
        while True:
            with lock:
                if left[0] <= 0 or (deadline is not None and time.monotonic() > deadline):
                    return
                left[0] -= 1
            try:
                one(draw)
            except Exception:  # recorded as the operation's outcome
                pass
            except BaseException as error:  # pragma: no cover - a KeyboardInterrupt
                errors.append(error)
                return

    started = [threading.Thread(target=worker, args=(number,), name=f"w{number}") for number in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    if errors:
        raise errors[0]
    return operations - max(left[0], 0)


__all__ = ["Mix", "Rows", "Subject", "layer_subject", "run_workload"]
