"""A warm start's calls (``Stampede.warm`` and ``awarm``), made by ``concurrency``
workers, each taking the next call in line: tasks of the event loop here (the hot sets
read in a worker thread), threads in the blocking twin. What a warm start does is
``_warming``'s."""

# _warm.py, the blocking twin, is generated from this module by .ci/unasync.py.  # ASYNC
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ._core import world
from ._core.store import HotSetStore
from ._drivers.hotset import WARMING
from ._drivers.observe import Events
from ._warming import Progress, Tally, WarmReport, check, check_kinds, jobs

ASYNCHRONOUS = True  # ASYNC
# SYNC: ASYNCHRONOUS = False


async def awarm(
    store: HotSetStore,
    events: Events,
    loaders: Sequence[Any],
    count: int,
    concurrency: int,
    progress: Progress | None,
) -> WarmReport:
    """Call the hottest calls the cache lacks, each worker taking the next in line."""
    check(concurrency, count)
    check_kinds(loaders, ASYNCHRONOUS)
    began = world.monotonic()
    line = await asyncio.to_thread(jobs, store, loaders, count, concurrency)
    tally = Tally(WarmReport(calls=sum(job.size for job in line)), events, progress)
    queue = iter(line)  # shared by the workers: each next() hands one job to one of them

    async def worker() -> None:
        token = WARMING.set(True)  # this worker's context only
        try:
            for job in queue:
                cached, rest, size = 0, None, job.size
                try:
                    cached, rest, size = job.rest(await job.loader.peek(*job.args, **job.kwargs))
                    if rest is not None:
                        await job.loader(*rest[0], **rest[1])
                    tally.add(cached, size)
                except Exception as error:
                    tally.add(cached, failed=size, error=error)
        finally:
            WARMING.reset(token)

    workers = min(concurrency, max(len(line), 1))
    if True:  # ASYNC
        await asyncio.gather(*(worker() for _ in range(workers)))
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="stampede-warm") as pool:
            for started in [pool.submit(worker) for _ in range(workers)]:
                started.result()
    tally.report.seconds = world.monotonic() - began
    return tally.report
