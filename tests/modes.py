"""The two ways an application calls a cached loader, so that a promise is written once and
run both ways (the ``mode`` fixture of conftest.py):

* ``Blocking``: a plain loader, called from threads (a burst: a thread per call, all
  released at once by a barrier).
* ``OnALoop``: an ``async def`` loader, called as tasks of one event loop that runs in a
  thread of its own for the whole test (a burst: a task per call, gathered).

A test builds its loader with ``mode.loader(database)`` and calls it with ``mode(load,
key)``, ``mode.burst(load, keys)`` or ``mode.start(load, key)`` (a future), whatever the
mode. ``mode(load.invalidate, key)`` invalidates either way. The loop finalizes its async
generators before it stops, which closes every layer's store for that loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

TIMEOUT = 30.0  # seconds: a call or a burst that takes longer is a hang


class Database:
    """A fake database for either kind of loader: counts calls per key. A load reads the
    row (``result(key)``, which may raise) when it starts, as a query would, sets
    ``started``, waits for ``release`` (set unless the test clears it), then takes
    ``delay`` seconds."""

    def __init__(self, result: Callable[[Any], Any] = lambda key: {"id": key}, delay: float = 0.0) -> None:
        self.result = result
        self.delay = delay
        self.calls: dict[Any, int] = {}
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self._lock = threading.Lock()

    def _read(self, key: Any) -> tuple[Any, BaseException | None]:
        with self._lock:
            self.calls[key] = self.calls.get(key, 0) + 1
        try:
            value, error = self.result(key), None
        except BaseException as raised:
            value, error = None, raised
        self.started.set()
        return value, error

    def load(self, key: Any) -> Any:
        """The blocking loader."""
        value, error = self._read(key)
        assert self.release.wait(TIMEOUT), "the test never released the loader"
        if self.delay:
            time.sleep(self.delay)
        if error is not None:
            raise error
        return value

    def coroutine(self) -> Callable[[Any], Any]:
        async def load(key: Any) -> Any:
            value, error = self._read(key)
            if not self.release.is_set():  # a worker thread waits, not the loop
                released = await asyncio.get_running_loop().run_in_executor(None, self.release.wait, TIMEOUT)
                assert released, "the test never released the loader"
            if self.delay:
                await asyncio.sleep(self.delay)
            if error is not None:
                raise error
            return value

        return load

    @property
    def total(self) -> int:
        return sum(self.calls.values())


def hammer(func: Callable[[Any], Any], args: list[Any]) -> list[Any]:
    """Call ``func(arg)`` for every arg from its own thread, all released at once."""
    barrier = threading.Barrier(len(args))

    def one(arg: Any) -> Any:
        barrier.wait(10)
        return func(arg)

    with ThreadPoolExecutor(len(args)) as pool:
        return list(pool.map(one, args))


def returning_errors(load: Callable[[Any], Any], expected: type[Exception]) -> Callable[[Any], Any]:
    """``load``, but an ``expected`` error is returned rather than raised (to collect outcomes)."""

    def call(key: Any) -> Any:
        try:
            return load(key)
        except expected as error:
            return error

    return call


class Blocking:
    name = "blocking"

    def loader(self, database: Database) -> Callable[[Any], Any]:
        return database.load

    def __call__(self, load: Callable[..., Any], *args: Any) -> Any:
        return load(*args)

    def start(self, load: Callable[..., Any], *args: Any) -> Future[Any]:
        """``load(*args)`` begun in a thread of its own: its outcome to come."""
        outcome: Future[Any] = Future()

        def run() -> None:
            try:
                outcome.set_result(load(*args))
            except BaseException as error:
                outcome.set_exception(error)

        threading.Thread(target=run, daemon=True).start()
        return outcome

    def burst(
        self, load: Callable[[Any], Any], args: Iterable[Any], errors: type[Exception] | None = None
    ) -> list[Any]:
        """``load(arg)`` for every arg, each from its own thread, all released at once
        (``hammer``). An ``errors`` exception is returned in place of the value, not raised."""
        return hammer(load if errors is None else returning_errors(load, errors), list(args))


class OnALoop:
    name = "asyncio"

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def loader(self, database: Database) -> Callable[[Any], Any]:
        return database.coroutine()

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(TIMEOUT)

    def __call__(self, load: Callable[..., Any], *args: Any) -> Any:
        return self._run(load(*args))

    def start(self, load: Callable[..., Any], *args: Any) -> Future[Any]:
        """``load(*args)`` begun as a task of the loop: its outcome to come."""
        return asyncio.run_coroutine_threadsafe(load(*args), self.loop)

    def burst(
        self, load: Callable[[Any], Any], args: Iterable[Any], errors: type[Exception] | None = None
    ) -> list[Any]:
        """``load(arg)`` for every arg, each as a task of the loop, gathered. An ``errors``
        exception is returned in place of the value, not raised."""
        args = list(args)

        async def gathered() -> list[Any]:
            outcomes = await asyncio.gather(*(load(arg) for arg in args), return_exceptions=errors is not None)
            for outcome in outcomes:
                if isinstance(outcome, BaseException) and not (errors and isinstance(outcome, errors)):
                    raise outcome
            return outcomes

        return self._run(gathered())  # type: ignore[no-any-return]

    def close(self) -> None:
        """Finalize the loop's async generators (each layer's store for this loop closes
        then), and stop the loop."""
        self._run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(TIMEOUT)
        self.loop.close()
