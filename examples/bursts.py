"""What the framework examples share: worker processes started together on one barrier,
each running one burst of requests (their Redis URL, given or a throwaway server's, is
``stampede.testing.server_url``'s). A module the examples import, not an example."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


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
