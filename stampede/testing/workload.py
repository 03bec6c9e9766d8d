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
import inspect
import random
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .._core.verify import verifying
from .history import Operation, Recorder

Row = dict[str, Any]  # {"key": key, "version": n}
T = TypeVar("T")


def _kind() -> str:
    return "verify" if verifying() else "load"


class Rows:
    """Versioned rows, thread-safe. ``load`` and ``load_many`` are loaders (``aload`` and
    ``aload_many`` their ``async`` forms): each run is recorded as a "load" of the versions
    it read (a "verify" when a verification calls it: ``stampede.verifying()``), after
    ``delay`` seconds of "query"."""

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
        with self.recorder.op(_kind(), key) as op:
            if self.delay:
                time.sleep(self.delay)
            return self._read(op, [key])[key]

    def load_many(self, keys: Sequence[Any]) -> dict[Any, Row]:
        with self.recorder.op(_kind(), *keys) as op:
            if self.delay:
                time.sleep(self.delay)
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

    def _read(self, op: Operation, keys: Sequence[Any]) -> dict[Any, Row]:
        with self._lock:
            found = {key: {"key": key, "version": self._versions.get(key, 0)} for key in keys}
        for key, row in found.items():
            op.saw(row["version"], key=key)
        return found


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


async def _settled(result: Any) -> Any:
    """What a plain call returned, or what an ``async`` one's awaitable gives."""
    return await result if inspect.isawaitable(result) else result


def layer_subject(
    layer: Any, rows: Rows, template: str = "row:{key}", *, asynchronous: bool = False, **settings: Any
) -> Subject:
    """A ``Subject`` of a stampede layer: a cached loader and a many-key loader over the
    same entries (``async`` ones if ``asynchronous``), invalidated after each write;
    ``set`` writes the row and then the entry; ``expire`` expires it."""
    one = layer.cached_loader(template, **settings)(rows.aload if asynchronous else rows.load)
    many = layer.cached_loader_many(template, **settings)(rows.aload_many if asynchronous else rows.load_many)

    async def update(key: Any) -> int:
        version = rows.write(key)
        await _settled(one.invalidate(key))
        return version

    async def set_(key: Any) -> int:
        version = rows.write(key)
        await _settled(one.set({"key": key, "version": version}, key))
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


class _Plan:
    """What the callers of one run share: the operations left, the deadline, and a lock
    per key (``writing``: async context managers), so that a row's writes do not race
    each other (a database serializes them: a write and its invalidation, or set, run
    under the key's lock; two writers setting one entry could leave the older value last,
    which no cache can know)."""

    def __init__(
        self, subject: Subject, keys: int, operations: int, seconds: float | None, mix: Mix, writing: list[Any]
    ) -> None:
        self.subject, self.keys, self.operations, self.left = subject, keys, operations, operations
        weights = {name: getattr(mix, name) for name in ("read", "read_many", "update", "set", "expire")}
        for optional in ("read_many", "set", "expire"):
            if getattr(subject, optional) is None:
                weights[optional] = 0
        self.names, self.weights = list(weights), list(weights.values())
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.lock = threading.Lock()
        self.writing = writing
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
        key = draw.randrange(plan.keys)
        try:
            if name == "read":
                with recorder.op("read", key) as op:
                    row = await _settled(subject.read(key))
                    if row is not None:
                        op.saw(row["version"], source=row["key"])
            elif name == "read_many":
                asked = draw.sample(range(plan.keys), min(plan.keys, draw.randint(2, 4)))
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
    raises is recorded with its exception's name and the run goes on. The subject's
    callables are plain, or ``async def`` ones that never wait (``layer_subject``'s)."""
    plan = _Plan(subject, keys, operations, seconds, mix, [_entered(threading.Lock()) for _ in range(keys)])

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
    keys: int = 6,
    tasks: int = 32,
    operations: int = 10_000,
    seconds: float | None = None,
    seed: int = 0,
    mix: Mix = Mix(),
) -> int:
    """``run_workload`` in ``tasks`` tasks of the running event loop, for a subject of
    ``async`` callables (``layer_subject(..., asynchronous=True)``)."""
    plan = _Plan(subject, keys, operations, seconds, mix, [asyncio.Lock() for _ in range(keys)])
    callers = [
        asyncio.create_task(_caller(plan, recorder, random.Random(seed * 1000 + number)), name=f"t{number}")
        for number in range(tasks)
    ]
    await asyncio.gather(*callers)
    return plan.ran()


__all__ = ["Mix", "Rows", "Subject", "arun_workload", "layer_subject", "run_workload"]
