"""What the framework examples share: a Redis URL (the one given, or a throwaway server's),
and worker processes started together on one barrier, each running one burst of
requests. A module the examples import, not an example."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def redis_url(given: str | None) -> Iterator[str]:
    """``given``, or the URL of a throwaway server on 127.0.0.1 (stopped on exit)."""
    if given is not None:
        yield given
        return
    from stampede.testing import RedisServer

    with RedisServer() as server:
        yield server.url


def run_workers(worker: Callable[..., None], processes: int, parties: int, *args: Any) -> bool:
    """``worker(*args, start)`` in ``processes`` fresh processes, ``start`` a barrier of
    ``parties`` (each process's callers wait on it, so that they begin together); True
    if every one exited cleanly within 60 s."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(parties)
    started = [context.Process(target=worker, args=(*args, start)) for _ in range(processes)]
    for process in started:
        process.start()
    for process in started:
        process.join(60)
    clean = all(process.exitcode == 0 for process in started)
    for process in started:
        if process.is_alive():
            process.kill()
    return clean
