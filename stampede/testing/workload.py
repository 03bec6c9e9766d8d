"""A generated workload for ``History.check``: callers over a few keys that collide,
while writers update the database and invalidate, set and expire, in threads
(``run_workload``) or in tasks of one event loop (``arun_workload``).

``Rows`` is the database: one versioned row per key, each write a new version. The
cache under test is driven through a ``Subject``: how it reads a key, reads many, and
what the application does on a write (``update``: the database write and the cache's
invalidation, in the order the application does them). Its callables may be plain or
``async``. ``layer_subject`` makes one of a stampede layer; a test can make one of
anything else (a deliberately broken cache, to see the checker catch it).

    rows = Rows(recorder)
    subject = layer_subject(layer, rows)
    run_workload(subject, recorder, threads=8, operations=20_000, seed=1)
    report = History.of(recorder).check(wait_bound=5.0)
    assert report.ok, str(report)

A caller's loop is written once, as a coroutine: a task awaits what an ``async``
subject returns; a thread drives the same coroutine to its end in one step, since a
plain subject gives it nothing to wait for.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from .._core.verify import verifying
from .history import Operation, Recorder

Row = dict[str, Any]  # {"key": key, "version": n}
T = TypeVar("T")


def _kind() -> str:
    return "verify" if verifying() else "load"


class DatabaseError(Exception):
    """A load that ``Rows(fails=...)`` failed."""


class Rows:
    """Versioned rows, thread-safe. ``load`` and ``load_many`` are loaders (``aload`` and
    ``aload_many`` their ``async`` forms): each run is recorded as a "load" of the versions
    it read (a "verify" when a verification calls it: ``stampede.verifying()``), after
    ``delay`` seconds of "query". ``fails``: asked after each query whether it failed (a
    ``DatabaseError``, recorded as the load's outcome)."""

    def __init__(self, recorder: Recorder, delay: float = 0.0, fails: Callable[[], bool] | None = None) -> None:
        self.recorder = recorder
        self.delay = delay
        self.fails = fails
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
        with self.recorder.op(_kind(), key) as op:
            self._query()
            return self._read(op, [key])[key]

    def load_many(self, keys: Sequence[Any]) -> dict[Any, Row]:
        with self.recorder.op(_kind(), *keys) as op:
            self._query()
            return self._read(op, keys)

    async def aload(self, key: Any) -> Row:
        with self.recorder.op(_kind(), key) as op:
            if self.delay:
                await asyncio.sleep(self.delay)
            return self._read(op, [key])[key]

    async def aload_many(self, keys: Sequence[Any]) -> dict[Any, Row]:
        with self.recorder.op(_kind(), *keys) as op:
            if self.delay:
                await asyncio.sleep(self.delay)
            return self._read(op, keys)

    def _query(self) -> None:
        """The blocking loaders' time in the database, once their load is recorded as begun."""
        if self.delay:
            time.sleep(self.delay)

    def _read(self, op: Operation, keys: Sequence[Any]) -> dict[Any, Row]:
        if self.fails is not None and self.fails():
            raise DatabaseError(f"the query of {list(keys)!r} failed")
        found = {key: {"key": key, "version": version} for key, version in zip(keys, self._current(keys), strict=True)}
        for key, row in found.items():
            op.saw(row["version"], key=key)
        return found

    def _current(self, keys: Sequence[Any]) -> list[int]:
        """The rows' versions now, in the order of ``keys``."""
        with self._lock:
            return [self._versions.get(key, 0) for key in keys]


KEEP_GREATER = """
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > held then redis.call('SET', KEYS[1], ARGV[1]) end
"""


class ServerRows(Rows):
    """``Rows`` kept in a Redis server at ``url``, so that the processes of a run share one
    database (``stampede.testing.workers``). A write takes its version first (a counter
    per row) and then writes it, the greater of it and the row's kept, under its record:
    a version reserved by a writer killed before its write is never read, and one it
    wrote is one whose write had begun. The ``async`` loaders read with the blocking
    client too (a round trip on 127.0.0.1)."""

    def __init__(
        self, recorder: Recorder, url: str, delay: float = 0.0, prefix: str = "rows:", hold: str | None = None
    ) -> None:
        """``hold``: a file whose presence holds the next blocking load, begun, until the
        file is gone (``Workers.kill`` asks for one to kill a worker mid-load)."""
        super().__init__(recorder, delay)
        self.prefix = prefix
        self.hold = hold
        self._client = redis.Redis.from_url(url)
        self._keep_greater = self._client.register_script(KEEP_GREATER)

    def write(self, key: Any) -> int:
        version = int(self._client.incr(f"{self.prefix}next:{key}"))
        with self.recorder.op("write", key, version=version):
            self._keep_greater(keys=[f"{self.prefix}row:{key}"], args=[version])
        return version

    def _query(self) -> None:
        super()._query()
        if self.hold is not None and os.path.exists(self.hold):
            held = f"{self.hold}.held"
            with open(held, "wb"):  # tells Workers.kill this load is begun and held
                pass
            deadline = time.monotonic() + 30.0  # never for ever: the file is gone within seconds
            while os.path.exists(self.hold) and time.monotonic() < deadline:
                time.sleep(0.005)

    def _current(self, keys: Sequence[Any]) -> list[int]:
        return [int(value or 0) for value in self._client.mget([f"{self.prefix}row:{key}" for key in keys])]

    def close(self) -> None:
        self._client.close()


@dataclass
class Subject:
    """The cache under test; each callable plain or ``async``. ``update(key)`` is the
    application's write path: it writes the row (``Rows.write``) and makes the cache
    forget the old one, and returns the version written. ``read_many``, ``expire`` and
    ``set`` are optional."""

    read: Callable[[Any], Any]
    update: Callable[[Any], Any]
    read_many: Callable[[list[Any]], Any] | None = None
    expire: Callable[[Any], Any] | None = None
    set: Callable[[Any], Any] | None = None
    update_tag: Callable[[list[Any]], Any] | None = None
    """The write path of a group: writes each of these rows, then invalidates the tag
    their entries carry; returns the versions written, by key."""
    expire_tag: Callable[[list[Any]], Any] | None = None
    """Expires the tag the entries of these keys carry."""


async def _settled(result: Any) -> Any:
    """What a plain call returned, or what an ``async`` one's awaitable gives."""
    return await result if inspect.isawaitable(result) else result


def layer_subject(
    layer: Any,
    rows: Rows,
    template: str = "row:{key}",
    *,
    asynchronous: bool = False,
    tag: str | None = "rows",
    **settings: Any,
) -> Subject:
    """A ``Subject`` of a stampede layer: a cached loader and a many-key loader over the
    same entries (``async`` ones if ``asynchronous``), invalidated after each write;
    ``set`` writes the row and then the entry; ``expire`` expires it. Every entry is
    tagged ``tag`` (unless it is None): ``update_tag`` writes the rows and invalidates
    the tag, ``expire_tag`` expires it."""
    tags = None if tag is None else [tag]
    one = layer.cached_loader(template, tags=tags, **settings)(rows.aload if asynchronous else rows.load)
    many = layer.cached_loader_many(template, tags=tags, **settings)(
        rows.aload_many if asynchronous else rows.load_many
    )

    async def update(key: Any) -> int:
        version = rows.write(key)
        await _settled(one.invalidate(key))
        return version

    async def set_(key: Any) -> int:
        version = rows.write(key)
        await _settled(one.set({"key": key, "version": version}, key))
        return version

    async def update_tag(keys: list[Any]) -> dict[Any, int]:
        versions = {key: rows.write(key) for key in keys}
        await _settled((layer.ainvalidate_tag if asynchronous else layer.invalidate_tag)(tag))
        return versions

    async def expire_tag(keys: list[Any]) -> None:
        await _settled((layer.aexpire_tag if asynchronous else layer.expire_tag)(tag))

    grouped = tag is not None
    return Subject(
        read=one,
        update=update,
        read_many=many,
        expire=one.expire,
        set=set_,
        update_tag=update_tag if grouped else None,
        expire_tag=expire_tag if grouped else None,
    )


@dataclass(frozen=True)
class Mix:
    """How often each operation is drawn (weights)."""

    read: float = 80
    read_many: float = 8
    update: float = 8
    set: float = 2
    expire: float = 2
    update_tag: float = 1
    expire_tag: float = 1


OPERATIONS = ("read", "read_many", "update", "set", "expire", "update_tag", "expire_tag")


class _Plan:
    """What the callers of one run share: the operations left, the deadline, and a lock
    per key (``writing``: async context managers), so that a row's writes do not race
    each other (a database serializes them: a write and its invalidation, or set, run
    under the key's lock; two writers setting one entry could leave the older value last,
    which no cache can know)."""

    def __init__(
        self, subject: Subject, keys: Sequence[Any], operations: int, seconds: float | None, mix: Mix, writing: Any
    ) -> None:
        self.subject, self.keys, self.operations, self.left = subject, list(keys), operations, operations
        weights = {name: getattr(mix, name) for name in OPERATIONS}
        for optional in OPERATIONS[1:]:
            if getattr(subject, optional) is None:
                weights[optional] = 0
        self.names, self.weights = list(weights), list(weights.values())
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.lock = threading.Lock()
        self.writing = {key: writing() for key in self.keys}
        self.errors: list[BaseException] = []

    def take(self) -> bool:
        with self.lock:
            if self.left <= 0 or (self.deadline is not None and time.monotonic() > self.deadline):
                return False
            self.left -= 1
            return True

    def ran(self) -> int:
        """How many operations ran; raises what stopped a caller, if anything did."""
        if self.errors:
            raise self.errors[0]
        return self.operations - max(self.left, 0)


async def _caller(plan: _Plan, recorder: Recorder, draw: random.Random) -> None:
    """One caller's loop."""
    subject = plan.subject
    while plan.take():
        name = draw.choices(plan.names, plan.weights)[0]
        key = draw.choice(plan.keys)
        try:
            if name in ("update_tag", "expire_tag"):  # every key: the tag is on every entry
                await _grouped(plan, recorder, name)
            elif name == "read":
                with recorder.op("read", key) as op:
                    row = await _settled(subject.read(key))
                    if row is not None:
                        op.saw(row["version"], source=row["key"])
            elif name == "read_many":
                asked = draw.sample(plan.keys, min(len(plan.keys), draw.randint(2, 4)))
                with recorder.op("read", *asked) as op:
                    found: Mapping[Any, Row | None] = await _settled(subject.read_many(asked))  # type: ignore[misc]
                    for asked_key, row in found.items():
                        if row is not None:
                            op.saw(row["version"], key=asked_key, source=row["key"])
            elif name == "expire":
                async with plan.writing[key], _entered(recorder.op("expire", key)):
                    await _settled(subject.expire(key))  # type: ignore[misc]
            else:  # "update" (an invalidation) or "set"
                kind, call = ("invalidate", subject.update) if name == "update" else ("set", subject.set)
                async with plan.writing[key], _entered(recorder.op(kind, key)) as op:
                    op.saw(await _settled(call(key)))  # type: ignore[misc]
        except Exception:  # recorded as the operation's outcome
            pass
        except BaseException as error:  # pragma: no cover - a KeyboardInterrupt
            plan.errors.append(error)
            return


async def _grouped(plan: _Plan, recorder: Recorder, name: str) -> None:
    """A tag's write path or its expiry, over every key, under every key's lock (taken in
    one order, so that two never wait for each other)."""
    keys = plan.keys
    async with contextlib.AsyncExitStack() as held:  # those taken are let go, even if a wait is cancelled
        for key in keys:
            await held.enter_async_context(plan.writing[key])
        if name == "update_tag":
            with recorder.op("invalidate", *keys) as op:
                versions = await _settled(plan.subject.update_tag(keys))  # type: ignore[misc]
                for key, version in versions.items():
                    op.saw(version, key=key)
        else:
            with recorder.op("expire", *keys):
                await _settled(plan.subject.expire_tag(keys))  # type: ignore[misc]


class _entered:
    """A plain context manager used in ``async with`` (the caller's loop is a coroutine),
    as often as it is entered."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    async def __aenter__(self) -> Any:
        return self.manager.__enter__()

    async def __aexit__(self, *exc: Any) -> Any:
        return self.manager.__exit__(*exc)


def _drive(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never waits (a plain subject's caller) to its end."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coroutine.close()
    raise TypeError("a subject's callable returned an awaitable: run it with arun_workload")


def _keys(keys: int | Sequence[Any]) -> list[Any]:
    return list(range(keys)) if isinstance(keys, int) else list(keys)


def run_workload(
    subject: Subject,
    recorder: Recorder,
    *,
    keys: int | Sequence[Any] = 6,
    threads: int = 8,
    operations: int = 10_000,
    seconds: float | None = None,
    seed: int = 0,
    mix: Mix = Mix(),
) -> int:
    """Run ``operations`` drawn from ``mix`` over ``keys`` (that many, from 0, or these)
    in ``threads`` threads
    (or until ``seconds`` pass), each recorded; returns how many ran. An operation that
    raises is recorded with its exception's name and the run goes on. The subject's
    callables are plain, or ``async def`` ones that never wait (``layer_subject``'s)."""
    plan = _Plan(subject, _keys(keys), operations, seconds, mix, lambda: _entered(threading.Lock()))

    def caller(number: int) -> None:
        try:
            _drive(_caller(plan, recorder, random.Random(seed * 1000 + number)))
        except BaseException as error:
            plan.errors.append(error)

    started = [threading.Thread(target=caller, args=(number,), name=f"w{number}") for number in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return plan.ran()


async def arun_workload(
    subject: Subject,
    recorder: Recorder,
    *,
    keys: int | Sequence[Any] = 6,
    tasks: int = 32,
    operations: int = 10_000,
    seconds: float | None = None,
    seed: int = 0,
    mix: Mix = Mix(),
) -> int:
    """``run_workload`` in ``tasks`` tasks of the running event loop, for a subject of
    ``async`` callables (``layer_subject(..., asynchronous=True)``)."""
    plan = _Plan(subject, _keys(keys), operations, seconds, mix, asyncio.Lock)
    callers = [
        asyncio.create_task(_caller(plan, recorder, random.Random(seed * 1000 + number)), name=f"t{number}")
        for number in range(tasks)
    ]
    await asyncio.gather(*callers)
    return plan.ran()


__all__ = ["DatabaseError", "Mix", "Rows", "ServerRows", "Subject", "arun_workload", "layer_subject", "run_workload"]
